"""A TCP proxy in front of a real service (Redis, PostgreSQL) that tests switch between
forwarding and failing, so a dependency fails in each way a network can make it fail
without disturbing the service other tests share."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Literal

import pytest

from tests.conftest import free_port

# forward: pass bytes both ways. refuse: nothing listens (connection refused). kill: a
# connection is closed as soon as a command arrives, unanswered (killed mid-command).
# hang: commands are read and never answered (the client's timeout). junk: a command is
# answered with bytes that are not the service's protocol.
Mode = Literal["forward", "refuse", "kill", "hang", "junk"]


class FaultyProxy:
    """Listens on ``port`` (loopback) and relays to ``target``, in threads; ``mode``
    applies to every connection from the moment it is set, open ones included."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.mode: Mode = "forward"
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._listen()

    def set(self, mode: Mode) -> None:
        """Switch to ``mode``; ``refuse`` stops listening, any other listens again."""
        with self._lock:
            self.mode = mode
            listener, self._listener = self._listener, None
        if mode == "refuse":
            if listener is not None:
                # Wakes the thread blocked in accept (a close alone would not, on Linux).
                with contextlib.suppress(OSError):
                    listener.shutdown(socket.SHUT_RDWR)
                listener.close()
            self.drop_connections()
        elif listener is None:
            self._listen()
        else:
            with self._lock:
                self._listener = listener

    def drop_connections(self) -> None:
        """Close every connection relayed now (their clients see them reset)."""
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.set("refuse")

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: refusing now
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while data := src.recv(65536):
                mode = self.mode
                if from_client and mode == "kill":
                    break
                if from_client and mode == "hang":
                    continue
                if from_client and mode == "junk":
                    src.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                    continue
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            self._sockets -= {src, dst}


def redis_proxy() -> Iterator[FaultyProxy]:
    """A ``FaultyProxy`` in front of ``REDIS_URL``'s server for a fixture to yield from
    (the test skips without ``REDIS_URL``)."""
    given = os.environ.get("REDIS_URL", "")
    if not given:
        pytest.skip("REDIS_URL is not set (make test sets it)")
    url = urllib.parse.urlsplit(given)
    proxy = FaultyProxy((url.hostname or "127.0.0.1", url.port or 6379))
    yield proxy
    proxy.close()
