"""Polling for a condition, for tests that wait on other processes or threads."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    interval: float = 0.05,
    detail: Callable[[], str] | None = None,
) -> T:
    """``predicate()``'s first truthy value within ``timeout`` seconds; else an
    AssertionError naming ``what``, followed by ``detail()`` (a log tail, say)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"timed out waiting for {what} ({timeout} s){tail}")
        time.sleep(interval)
