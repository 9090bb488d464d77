"""The log check of the suites that run servers (the gateway's, the engine server's): a
test fails when, while it ran, an exception was logged that it did not declare, in this
process (a record at ERROR or above with a traceback) or in a subprocess it started (a
``Traceback`` in any ``*.log`` under pytest's temporary directory, where ``Process``
and the fixtures write the output of ``shunter web`` and ``shunter engine``).

A test that provokes one on purpose says so: ``@pytest.mark.expect_log("pattern", ...)``;
an exception whose text (the log line before it and its traceback) matches one of the
regular expressions is allowed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

MARKER = "expect_log"
TRACEBACK = "Traceback (most recent call last):"
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def register(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*patterns): the test's logs may hold exceptions matching these regular "
        "expressions (tests/logcheck.py)",
    )


def tracebacks(text: str) -> list[str]:
    """Each traceback in ``text`` (chained ones together), with the line before it."""
    lines = text.splitlines()
    found: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(TRACEBACK):
            i += 1
            continue
        start, i = max(0, i - 1), i + 1
        while i < len(lines):
            line = lines[i]
            i += 1
            if line.startswith((" ", "\t", TRACEBACK)) or not line.strip():
                continue
            # The exception's own line; a chained one follows after a blank line.
            rest = [later for later in lines[i : i + 3] if later.strip()]
            if not (rest and rest[0].startswith(CHAINED)):
                break
        found.append("\n".join(lines[start:i]))
    return found


def _record_text(record: logging.LogRecord) -> str:
    text = f"{record.levelname} {record.name}: {record.getMessage()}"
    if record.exc_info:
        text += "\n" + logging.Formatter().formatException(record.exc_info)
    return text


class LogFiles:
    """The ``*.log`` files under ``root`` and how much of each was there already."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.offsets = {path: path.stat().st_size for path in self._paths()}

    def _paths(self) -> list[Path]:
        return [path for path in self.root.rglob("*.log") if path.is_file()]

    def new_text(self) -> dict[Path, str]:
        """What was written to each file since (a file made since: all of it)."""
        texts: dict[Path, str] = {}
        for path in self._paths():
            with path.open("rb") as handle:
                handle.seek(self.offsets.get(path, 0))
                texts[path] = handle.read().decode(errors="replace")
        return texts


def checked(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture, root: Path
) -> Iterator[None]:
    """The autouse fixture's body: runs the test, then fails it on an undeclared
    exception in its logs."""
    files = LogFiles(root)
    yield
    expected = [
        re.compile(pattern) for mark in request.node.iter_markers(MARKER) for pattern in mark.args
    ]
    found = [
        ("this process", _record_text(record))
        for when in ("setup", "call")
        for record in caplog.get_records(when)  # type: ignore[arg-type]
        if record.levelno >= logging.ERROR and record.exc_info
    ]
    for path, text in files.new_text().items():
        found += [(str(path.relative_to(root)), block) for block in tracebacks(text)]
    unexpected = [
        f"--- {where}:\n{text}"
        for where, text in found
        if not any(pattern.search(text) for pattern in expected)
    ]
    if unexpected:
        pytest.fail(
            "unexpected exceptions in the logs (declare expected ones with "
            f"@pytest.mark.{MARKER}):\n" + "\n".join(unexpected),
            pytrace=False,
        )


# A conftest imports these two (``log_check`` and ``pytest_configure``, as unused names
# the linter is told to keep) to put its directory's tests under the check.
def pytest_configure(config: pytest.Config) -> None:
    register(config)


@pytest.fixture(autouse=True)
def log_check(
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    yield from checked(request, caplog, tmp_path_factory.getbasetemp())
