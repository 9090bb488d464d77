"""One streamed request to an OpenAI-compatible server, timed token by token.

The client posts to ``/v1/completions`` or ``/v1/chat/completions`` with ``stream``,
``stream_options.include_usage``, ``max_tokens`` and ``ignore_eos`` (so the server
honours the requested length), greedy. Every streamed chunk carrying text is timed on
arrival: the first is the first token, the gaps between them the ITL (per chunk, as
``vllm bench serve`` measures it; the chat role-only opening chunk carries no text and
does not count). The output token count is the server's ``usage.completion_tokens`` when
reported, else the number of text chunks. Any failure (HTTP status, error event in the
stream, a stream cut before ``[DONE]``, a connection error or timeout) is recorded on
the result; nothing raises.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

import aiohttp

from shunter.engine.sim.metrics import RequestRecord
from shunter.engine.workload.requests import RequestSpec

Endpoint = Literal["chat", "completions"]
ENDPOINT_PATHS: dict[str, str] = {
    "chat": "/chat/completions",
    "completions": "/completions",
}
_ERROR_TEXT_CHARS = 300


@dataclass(frozen=True)
class Target:
    """An OpenAI-compatible server: Shunter's gateway, an engine, a vLLM server.

    ``base_url`` may end in ``/v1`` or not (``http://host:8000`` and
    ``http://host:8000/v1`` are the same target). ``api_key`` goes out as a bearer token.
    Each request is greedy and ignores EOS unless ``ignore_eos`` is off or
    ``extra_body`` says otherwise: its fields (sampling parameters, anything the server
    takes) go into every body, over the defaults. ``extra_headers`` go out with each.
    """

    base_url: str
    model: str
    api_key: str | None = None
    endpoint: Endpoint = "completions"
    ignore_eos: bool = True
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    extra_headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base URL must start with http:// or https://: {self.base_url!r}")
        if self.endpoint not in ENDPOINT_PATHS:
            raise ValueError(f"endpoint must be 'chat' or 'completions', not {self.endpoint!r}")
        if not self.model:
            raise ValueError("a model name is required")

    @property
    def url(self) -> str:
        base = self.base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return base + ENDPOINT_PATHS[self.endpoint]

    @property
    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **self.extra_headers}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def body(self, spec: RequestSpec) -> bytes:
        """The JSON request body for ``spec``."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": spec.output_len,
            "ignore_eos": self.ignore_eos,
            "temperature": 0.0,
            **self.extra_body,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": spec.prompt}]
        else:
            body["prompt"] = spec.prompt
        return json.dumps(body).encode()


@dataclass(slots=True)
class RequestResult:
    """What happened to one request. Times are seconds from the start of the run.

    ``t_scheduled``: when the arrival process meant to send it. ``t_start``: when the
    client issued it (after a concurrency slot, if capped); TTFT and E2E count from here,
    as in ``vllm bench serve``. ``t_sent``: when its request headers were written to the
    socket; ``t_sent - t_scheduled`` is the generator's own timing error. ``t_end``: when
    the response ended or failed. ``token_times``: arrival of each text chunk. ``status``
    is the HTTP status (None if none came back); ``error_type`` and ``error`` say what
    failed.
    """

    index: int
    t_scheduled: float
    input_tokens: int
    expected_output_tokens: int
    t_start: float | None = None
    t_sent: float | None = None
    t_end: float | None = None
    token_times: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    output_tokens: int = 0
    success: bool = False
    status: int | None = None
    error_type: str | None = None
    error: str | None = None

    @property
    def generated_text(self) -> str:
        return "".join(self.text)

    @property
    def send_lag(self) -> float | None:
        """Seconds from the scheduled time to the headers leaving (None if never sent)."""
        return None if self.t_sent is None else self.t_sent - self.t_scheduled

    def record(self) -> RequestRecord:
        """The metrics' view of this request."""
        times = tuple(self.token_times)
        t_arrival = self.t_start if self.t_start is not None else self.t_scheduled
        return RequestRecord(
            t_arrival=t_arrival,
            t_first_token=times[0] if times else None,
            t_last_token=times[-1] if times else None,
            num_output_tokens=self.output_tokens,
            success=self.success,
            token_times=times,
        )

    def fail(self, error_type: str, error: str) -> None:
        self.success = False
        self.error_type = error_type
        self.error = error[:_ERROR_TEXT_CHARS]


@dataclass(frozen=True, slots=True)
class _SendClock:
    """Passed as ``trace_request_ctx``: where and from which origin to record ``t_sent``."""

    result: RequestResult
    t0: float


def trace_config() -> aiohttp.TraceConfig:
    """Records when each request's headers were written (``RequestResult.t_sent``)."""

    async def on_headers_sent(
        _session: aiohttp.ClientSession,
        ctx: SimpleNamespace,
        _params: aiohttp.TraceRequestHeadersSentParams,
    ) -> None:
        clock = ctx.trace_request_ctx
        if isinstance(clock, _SendClock):
            clock.result.t_sent = time.perf_counter() - clock.t0

    config = aiohttp.TraceConfig()
    config.on_request_headers_sent.append(on_headers_sent)
    return config


async def send_request(
    session: aiohttp.ClientSession,
    target: Target,
    spec: RequestSpec,
    result: RequestResult,
    t0: float,
) -> None:
    """Send ``spec`` to ``target`` and fill ``result``; ``t0`` is the run's start
    (perf_counter). ``session`` must carry ``trace_config()`` for ``t_sent``."""
    chat = target.endpoint == "chat"
    body = target.body(spec)
    result.t_start = time.perf_counter() - t0
    times, text = result.token_times, result.text
    usage_tokens: int | None = None
    done = False
    error = ("incomplete_stream", "the stream ended before data: [DONE]")
    try:
        async with session.post(
            target.url, data=body, headers=target.headers, trace_request_ctx=_SendClock(result, t0)
        ) as resp:
            result.status = resp.status
            if resp.status != 200:
                result.fail(*_http_error(resp.status, await resp.read()))
                return
            buffer = b""
            async for data in resp.content.iter_any():
                if done:
                    continue  # read to the end: a drained connection goes back to the pool
                now = time.perf_counter() - t0
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                for raw in lines:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    event = _parse_event(payload)
                    if "error" in event and not event.get("choices"):
                        result.fail(*_event_error(event["error"]))
                        return
                    if piece := _text(event, chat):
                        times.append(now)
                        text.append(piece)
                    usage = event.get("usage")
                    if usage:
                        usage_tokens = usage.get("completion_tokens")
                        prompt_tokens = usage.get("prompt_tokens")
                        if isinstance(prompt_tokens, int):
                            result.input_tokens = prompt_tokens
    except TimeoutError:
        error = ("timeout", "no data within the read timeout")
    except BadEvent as exc:
        error = ("bad_event", str(exc))
    except Exception as exc:  # any client or protocol error is a failed request
        error = (type(exc).__name__, str(exc) or type(exc).__name__)
    finally:
        result.t_end = time.perf_counter() - t0
    if done:  # whatever the connection did after [DONE], the response was complete
        result.success = True
        result.output_tokens = usage_tokens if isinstance(usage_tokens, int) else len(times)
    else:
        result.fail(*error)


# raw_decode goes straight to the C scanner: json.loads's type checks and whitespace
# regexes cost more than the parse of a small event, and a stream has one per token.
_raw_decode = json.JSONDecoder().raw_decode


class BadEvent(ValueError):
    """A stream event that is not a JSON object."""


def _parse_event(payload: bytes) -> dict[str, Any]:
    try:
        event = _raw_decode(payload.decode())[0]
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both
        event = None
    if not isinstance(event, dict):
        raise BadEvent(f"not a JSON object: {payload[:80]!r}")
    return event


def _text(event: dict[str, Any], chat: bool) -> str:
    """The text an event streams ("" for none)."""
    choices = event.get("choices")
    if not choices:
        return ""
    choice = choices[0]
    if chat:
        delta = choice.get("delta") or {}
        piece = delta.get("content") or delta.get("reasoning_content")
    else:
        piece = choice.get("text")
    return piece if isinstance(piece, str) else ""


def _http_error(status: int, body: bytes) -> tuple[str, str]:
    """``(type, message)`` of an error reply: the OpenAI error's, else ``http_<status>``."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):
        return str(error.get("type") or f"http_{status}"), str(error.get("message") or "")
    return f"http_{status}", body.decode(errors="replace").strip()


def _event_error(error: Any) -> tuple[str, str]:
    if isinstance(error, dict):
        return str(error.get("type") or "stream_error"), str(error.get("message") or "")
    return "stream_error", str(error)
