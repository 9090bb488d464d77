"""Stopping a running run: a cancel request or its deadline, polled off the load
generator's event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Coroutine
from contextlib import suppress
from typing import Any, TypeVar

from django.db import connection

from shunter.platform.models import BenchmarkRun

# How often a running run looks for a cancel request and its deadline.
STOP_POLL_S = 0.25


class Stopped(Exception):
    """A run stopped before its end: ``reason`` is ``cancelled`` or ``timeout``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_T = TypeVar("_T")


class StopWatch:
    """Answers "should this run stop?" (a cancel request in the database, or the
    deadline) from one thread of its own, so that the database is never queried from
    the load generator's event loop, and its connection is closed at the end."""

    def __init__(self, run_id: int, deadline: float) -> None:
        self.run_id, self.deadline = run_id, deadline
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bench-stop")

    def __enter__(self) -> StopWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        # ``connection`` resolves per thread when called: close the pool thread's own.
        self._pool.submit(lambda: connection.close()).result()
        self._pool.shutdown()

    def _reason(self) -> str | None:
        if time.monotonic() > self.deadline:
            return "timeout"
        if BenchmarkRun.objects.filter(pk=self.run_id, cancel_requested=True).exists():
            return "cancelled"
        return None

    def check(self) -> None:
        """Raise Stopped if the run should stop."""
        reason = self._pool.submit(self._reason).result()
        if reason:
            raise Stopped(reason)

    async def watch(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Await ``coro``, cancelling it (and raising Stopped) once the run should stop."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(coro)
        while True:
            done, _ = await asyncio.wait({task}, timeout=STOP_POLL_S)
            if done:
                return task.result()
            reason = await asyncio.wrap_future(self._pool.submit(self._reason), loop=loop)
            if reason:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
                raise Stopped(reason)
