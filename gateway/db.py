"""The gateway's database work: ORM calls run on a small thread pool, off the event
loop, and are awaited from any loop; an unreachable database is a 503 to the client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from django.db import InterfaceError, OperationalError, close_old_connections, connections

from shunter.engine.api.errors import ApiError

log = logging.getLogger("shunter.gateway.db")

T = TypeVar("T")

# Database work of the gateway runs here, off the event loop; a small pool bounds the
# connections it holds.
DB_THREADS = 4
_db_pool = ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="gateway-db")


def submit_db(fn: Callable[[], T]) -> concurrent.futures.Future[T]:
    """Start ``fn`` (ORM code) in the gateway's database threads; its future can be
    awaited from any event loop (``asyncio.wrap_future``)."""

    def job() -> T:
        close_old_connections()  # honour CONN_MAX_AGE and health checks in pool threads
        return fn()

    return _db_pool.submit(job)


async def await_shared(future: concurrent.futures.Future[T]) -> T:
    """Wait for ``future``, a read that other requests wait for too. Cancelling this
    waiter (its client left) ends only this wait: the read goes on for the others. A
    plain ``asyncio.wrap_future`` would cancel the shared future with it, and every other
    waiter would get ``CancelledError``."""
    return await asyncio.shield(asyncio.wrap_future(future))


# What Django raises when the database cannot be reached or the connection broke.
DATABASE_DOWN = (OperationalError, InterfaceError)


def database_unavailable() -> ApiError:
    """The refusal of a request that needs the database while it is unreachable."""
    return ApiError(
        503,
        "The service's database is unreachable; try again in a few seconds.",
        type="service_unavailable",
        code="database_unavailable",
    )


async def await_read(future: concurrent.futures.Future[T]) -> T:
    """``await_shared`` for a database read: an unreachable database is the ApiError
    ``database_unavailable`` (503), not the driver's exception."""
    try:
        return await await_shared(future)
    except DATABASE_DOWN as e:
        log.warning("database unreachable: %s", e)
        raise database_unavailable() from None


async def run_db(fn: Callable[[], T]) -> T:
    """Run ``fn`` (ORM code) in the gateway's database threads and await its result."""
    return await asyncio.wrap_future(submit_db(fn))


def close_db_connections() -> None:
    """Close the database connections the gateway's threads hold (at shutdown, or before
    a test database is dropped). One job per thread, held at a barrier so that every
    thread runs one."""
    barrier = threading.Barrier(DB_THREADS)

    def close() -> None:
        barrier.wait(timeout=30)
        connections.close_all()

    for future in [_db_pool.submit(close) for _ in range(DB_THREADS)]:
        future.result()
