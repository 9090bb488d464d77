"""One value per running event loop (``LoopLocal``)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LoopLocal(Generic[T]):
    """One ``T`` per running event loop, made on first use: asyncio clients (aiohttp
    sessions, Redis pools) are bound to the loop that made them."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._values: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        value = self._values.get(loop)
        if value is None:
            value = self._values[loop] = self._factory()
        return value

    def pop(self) -> T | None:
        """This loop's value, forgotten (the caller closes it)."""
        return self._values.pop(asyncio.get_running_loop(), None)
