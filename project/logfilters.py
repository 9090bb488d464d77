"""Log filters of the project's logging configuration (``settings.LOGGING``)."""

from __future__ import annotations

import logging


class RefusedHost(logging.Filter):
    """A request with a Host header outside ``ALLOWED_HOSTS`` is refused with a 400; it is
    the client's mistake or a scan, not the server's: one warning line, no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True
