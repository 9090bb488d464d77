"""What an engine's bearer token may hold: it travels in an HTTP header
(``Authorization: Bearer TOKEN``), which holds Latin-1 at most and, for a bearer token,
no spaces, so visible ASCII only. The engine checks its own token with it and the
control plane every token it stores for a node."""

from __future__ import annotations

import re

TOKEN_PATTERN = r"^[!-~]*\Z"
TOKEN_RULE = "printable ASCII characters without spaces (the token is sent in an HTTP header)"


def is_header_token(token: str) -> bool:
    """Whether ``token`` may be sent as a bearer token."""
    return re.match(TOKEN_PATTERN, token) is not None
