"""The demo's child processes (``shunter model init``, the engine, the load generator):
each runs in its own session, logs to a file and dies with the demo; stopping one is
SIGTERM, then SIGKILL. ``DemoError`` is how a piece of the demo says it cannot come up."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CHILD_STOP_S = 20.0


class DemoError(Exception):
    """The demo cannot come up; the message says why (and where the logs are)."""


def shunter_command(*args: str) -> list[str]:
    """The ``shunter`` command of this interpreter (no reliance on PATH)."""
    return [sys.executable, "-m", "shunter.project.cli", *args]


def _die_with_parent() -> None:
    """In a child before exec: on Linux, receive SIGTERM when the demo dies, even by
    SIGKILL, so no engine or generator outlives it."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def spawn(command: Sequence[str], log: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own, its output appended to ``log``, tied to
    the demo's life; ``kwargs`` go to ``subprocess.Popen``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            **kwargs,
        )


def stop_child(proc: subprocess.Popen[bytes], timeout_s: float = CHILD_STOP_S) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; reaps the child either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
