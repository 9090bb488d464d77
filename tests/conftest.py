"""Suite-wide fixtures. Each test module states what it needs (db, redis, subprocesses)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from django.core.exceptions import SynchronousOnlyOperation
from django.test import Client

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

# Without a CUDA device the kernel tests run Triton's kernels on CPU tensors through its
# interpreter. Triton reads the variable when it is first imported, and some test
# modules import it indirectly, so it is set here, before any test module is collected.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def database_down() -> Iterator[None]:
    """PostgreSQL unreachable for this process: its open connections (the test's, the
    gateway's database threads') are closed, and new ones go to a port where nothing
    listens, until the block ends. Every thread's connections share one settings dict."""
    from django.db import connection

    from shunter.gateway.db import close_db_connections

    def close_connections() -> None:
        close_db_connections()
        # An async test's own thread runs the loop and holds no connection to close.
        with contextlib.suppress(SynchronousOnlyOperation):
            connection.close()

    close_connections()
    port = connection.settings_dict["PORT"]
    connection.settings_dict["PORT"] = str(free_port())
    try:
        yield
    finally:
        connection.settings_dict["PORT"] = port
        close_connections()


class Process:
    """A subprocess with its output in a log file."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.handle = log.open("wb")
        self.proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=self.handle, stderr=subprocess.STDOUT
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.handle.close()

    def output(self) -> str:
        self.handle.flush()
        return self.log.read_text(errors="replace")


@pytest.fixture
def clean_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment for a child process on the embedded default, data under tmp_path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"}
    }
    env["SHUNTER_VAR_DIR"] = str(tmp_path / "var")
    env["PYTHONUNBUFFERED"] = "1"
    yield env


class HttpsClient(Client):
    """Django's test client speaking HTTPS, as clients of a production deployment do.

    The suite runs with production settings (DEBUG off, HTTPS redirect on).
    """

    def request(self, **request: Any) -> Any:
        request.update({"wsgi.url_scheme": "https", "SERVER_PORT": "443"})
        return super().request(**request)


@pytest.fixture
def client() -> Client:
    return HttpsClient()
