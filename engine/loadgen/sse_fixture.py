"""A minimal OpenAI-compatible streaming server: the load generator's benchmark fixture.

It answers ``/v1/completions`` and ``/v1/chat/completions`` by streaming fixed tokens
(``max_tokens`` of them, else ``--tokens``), one per step of a shared ticker every
``--itl-ms`` milliseconds, as an engine emits one token per running request per step;
with ``--itl-ms 0`` it writes them back to back. It computes nothing, so what a client
measures against it is the client's own overhead. ``/health`` answers 200.

Run it in its own process (``python -m shunter.engine.loadgen.sse_fixture --port N``, or
``fixture_process()``), so it does not share the generator's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import IO, Any

from aiohttp import web

TOKEN_TEXT = " tok"


def _chunk(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class Fixture:
    """The fixture's handlers, its pre-encoded chunks and the ticker."""

    def __init__(self, *, tokens: int, itl_s: float, model: str | None, api_key: str | None):
        self.tokens = tokens
        self.itl_s = itl_s
        self.model = model
        self.api_key = api_key
        self._tick: asyncio.Future[None] | None = None

    async def ticker(self) -> None:
        """Every ``itl_s``, wake every stream waiting for its next token."""
        loop = asyncio.get_running_loop()
        self._tick = loop.create_future()
        while True:
            await asyncio.sleep(self.itl_s)
            tick, self._tick = self._tick, loop.create_future()
            tick.set_result(None)

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, chat=True)

    async def _stream(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error(401, "invalid_api_key", "Invalid API key.")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "invalid_request_error", "The body is not JSON.")
        if not isinstance(body, dict):
            return _error(400, "invalid_request_error", "The body must be a JSON object.")
        model = str(body.get("model", ""))
        if self.model is not None and model != self.model:
            return _error(404, "model_not_found", f"The model '{model}' does not exist.")
        n = body.get("max_tokens") or self.tokens
        if not isinstance(n, int) or n < 1:
            return _error(400, "invalid_request_error", "'max_tokens' must be a positive integer.")
        prompt = (
            " ".join(str(m.get("content", "")) for m in body.get("messages") or [])
            if chat
            else str(body.get("prompt", ""))
        )
        options = body.get("stream_options") or {}
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))

        kind = "chat.completion.chunk" if chat else "text_completion"
        envelope = {"id": "fixture", "object": kind, "created": 0, "model": model}

        def choice(text: str, finish: str | None, first: bool = False) -> dict[str, Any]:
            if chat:
                delta = {"role": "assistant", "content": ""} if first else {"content": text}
                return {"index": 0, "delta": delta, "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish}

        token = _chunk({**envelope, "choices": [choice(TOKEN_TEXT, None)]})
        last = _chunk({**envelope, "choices": [choice(TOKEN_TEXT, "length")]})
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        if chat:
            await response.write(_chunk({**envelope, "choices": [choice("", None, first=True)]}))
        for i in range(n):
            if self._tick is not None:
                await self._tick
            await response.write(last if i == n - 1 else token)
        if include_usage:
            usage = {
                "prompt_tokens": len(prompt.split()),
                "completion_tokens": n,
                "total_tokens": len(prompt.split()) + n,
            }
            await response.write(_chunk({**envelope, "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _error(status: int, kind: str, message: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.json_response(body, status=status)


def build_app(fixture: Fixture) -> web.Application:
    app = web.Application()
    app.router.add_get("/health", fixture.health)
    app.router.add_post("/v1/completions", fixture.completions)
    app.router.add_post("/v1/chat/completions", fixture.chat)

    async def ticker(_app: web.Application) -> Any:
        task = asyncio.create_task(fixture.ticker()) if fixture.itl_s > 0 else None
        yield
        if task is not None:
            task.cancel()

    app.cleanup_ctx.append(ticker)
    return app


async def serve(fixture: Fixture, host: str, port: int) -> None:
    """Serve until cancelled."""
    runner = web.AppRunner(build_app(fixture), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=1024).start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    from shunter.engine.loadgen.runner import run_async

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tokens", type=int, default=64, help="tokens per response (default 64)")
    p.add_argument("--itl-ms", type=float, default=10.0, help="ms between tokens (default 10)")
    p.add_argument("--model", help="the only model name accepted (default: any)")
    p.add_argument("--api-key", help="bearer token required (default: none)")
    p.add_argument(
        "--nice", type=int, default=0, help="lower this process's priority by N (default 0)"
    )
    ns = p.parse_args(argv)
    if ns.nice:
        os.nice(ns.nice)
    fixture = Fixture(
        tokens=ns.tokens, itl_s=ns.itl_ms / 1000.0, model=ns.model, api_key=ns.api_key
    )
    with suppress(KeyboardInterrupt):
        run_async(serve(fixture, ns.host, ns.port))
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def fixture_process(
    *,
    tokens: int = 64,
    itl_ms: float = 10.0,
    model: str | None = None,
    api_key: str | None = None,
    nice: int = 0,
) -> Iterator[str]:
    """The fixture in a child process on a free loopback port; yields its base URL once
    ``/health`` answers, and stops it on exit. ``nice`` lowers its priority."""
    port = free_port()
    command = [sys.executable, "-m", "shunter.engine.loadgen.sse_fixture", "--port", str(port)]
    command += ["--tokens", str(tokens), "--itl-ms", str(itl_ms), "--nice", str(nice)]
    if model is not None:
        command += ["--model", model]
    if api_key is not None:
        command += ["--api-key", api_key]
    # A file, not a pipe: a pipe nobody reads would block the fixture once full.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(command, env=os.environ.copy(), stdout=log, stderr=log)
        try:
            yield _wait_healthy(proc, f"http://127.0.0.1:{port}", log)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log: IO[bytes]) -> str:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log.seek(0)
                err = log.read().decode(errors="replace")
                raise RuntimeError(f"the SSE fixture did not start: {err}") from None
            time.sleep(0.05)


if __name__ == "__main__":
    raise SystemExit(main())
