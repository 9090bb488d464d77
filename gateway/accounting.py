"""What one response amounted to: its tokens, its client-visible times and how it
ended, tallied while the gateway relays it and given as its RequestRecord's fields.

Usage: the engine is always asked for usage, on every chunk of a stream
(``stream_options.include_usage`` and ``continuous_usage_stats``), so streamed tokens
count against quotas like non-streamed ones, and a stream that ends early counts the
tokens the engine last reported, however many shared a chunk. The usage reaches the
client only as it asked for it. A stream that ends before any usage counts the prompt
the engine reported in ``X-Shunter-Prompt-Tokens``.

Timing (ARCHITECTURE.md's definitions, measured at the gateway): TTFT from the request's
arrival to the first chunk that carries output; ITL between consecutive output chunks
of a choice (max ITL kept); TPOT = (last - first) / (tokens per choice - 1). A
non-streamed response shows all its tokens at once; the engine's ``X-Shunter-Timing``
gives its TPOT and max ITL, and its TTFT is the gateway's end-to-end time less how long
the engine held the answer after its first token (engine ``e2e_ms - ttft_ms``). From an
engine without that header (vLLM) TTFT is the end-to-end time and TPOT, max ITL and
whether it met its TBT target are unknown (None).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shunter.engine import latency
from shunter.engine.api.timing import EngineTiming
from shunter.gateway.routes import Route


@dataclass
class Timing:
    """Client-visible token times of one response (``perf_counter`` seconds)."""

    t0: float
    first: float | None = None
    last: float | None = None
    max_gap: float = 0.0
    token_chunks: int = 0
    _last_of: dict[int, float] = field(default_factory=dict)

    def token(self, index: int, now: float) -> None:
        prev = self._last_of.get(index)
        if prev is not None:
            self.max_gap = max(self.max_gap, now - prev)
        elif self.first is None:
            self.first = now
        self._last_of[index] = now
        self.last = now
        self.token_chunks += 1

    def all_at(self, now: float, engine: EngineTiming | None = None) -> None:
        """A non-streamed response: every token arrives at ``now``; with the
        ``engine``'s timing, the first when the client would have seen it streamed."""
        self.first = self.last = now
        self._last_of[0] = now
        if engine is not None:
            held_s = (engine.e2e_ms - engine.ttft_ms) / 1000
            self.first = max(self.t0, now - held_s)

    @property
    def num_choices(self) -> int:
        return max(1, len(self._last_of))


def token_count(value: Any) -> int:
    """A token count as an engine gave it (a header or a usage field); 0 when it is not
    a non-negative integer."""
    try:
        count = int(value)
    except (TypeError, ValueError):
        return 0
    return max(count, 0)


def _has_output(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return bool(text) or bool(choice.get("token_ids"))


@dataclass
class Tally:
    """One response as it is relayed: what the client asked to see of the usage, the
    engine's latest usage, the token times, and how the response ended."""

    timing: Timing
    stream: bool = False
    wants_usage: bool = False
    wants_chunk_usage: bool = False  # the client asked for continuous_usage_stats too
    done: bool = False
    usage: dict[str, Any] = field(default_factory=dict)
    reported_prompt_tokens: int = 0  # X-Shunter-Prompt-Tokens
    engine_timing: EngineTiming | None = None  # X-Shunter-Timing
    status: str = "ok"
    error_type: str = ""
    http_status: int = 200
    t_end: float | None = None

    def ask_usage(self, body: dict[str, Any]) -> None:
        """Note whether ``body`` asks for a stream and its usage, and make a stream's
        ``body`` ask the engine for the usage on every chunk."""
        self.stream = body.get("stream") is True
        if not self.stream:
            return
        options = body.get("stream_options")
        if options is None or isinstance(options, dict):
            options = options or {}
            self.wants_usage = options.get("include_usage") is True
            self.wants_chunk_usage = (
                self.wants_usage and options.get("continuous_usage_stats") is True
            )
            # Every chunk then carries the engine's token count so far: a stream that
            # ends early counts what the engine generated, not the chunks relayed.
            body["stream_options"] = {
                **options,
                "include_usage": True,
                "continuous_usage_stats": True,
            }

    def answered(self, raw: bytes, now: float, engine_timing: EngineTiming | None) -> None:
        """A whole (non-streamed) answer ``raw`` arrived at ``now``, timed by the engine
        as ``engine_timing``."""
        self.t_end = now
        self.engine_timing = engine_timing
        self.timing.all_at(now, engine_timing)
        try:
            usage = json.loads(raw).get("usage")
        except (ValueError, AttributeError):
            usage = None
        self.usage = usage if isinstance(usage, dict) else {}
        self.done = True

    def on_event(self, event: bytes, now: float) -> bytes | None:
        """Account for one SSE event; what to pass on (None: nothing). The usage every
        chunk carries (the engine's count so far) is kept as the latest count and left
        out of what the client sees unless it asked for it."""
        if not event.startswith(b"data: "):
            return event
        payload = event[6:].strip()
        if payload == b"[DONE]":
            self.done = True
            return event
        try:
            chunk = json.loads(payload)
        except ValueError:
            return event
        if not isinstance(chunk, dict):
            return event
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {}
            self.status = "error"
            self.error_type = str(error.get("code") or error.get("type") or "engine_error")
            return event
        choices = chunk.get("choices") or []
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        if not choices:
            return event if self.wants_usage or not isinstance(usage, dict) else None
        for choice in choices:
            if isinstance(choice, dict) and _has_output(choice):
                self.timing.token(int(choice.get("index") or 0), now)
        if usage is None or self.wants_chunk_usage:
            return event
        if self.wants_usage:
            chunk["usage"] = None  # OpenAI's chunks before the usage chunk
        else:
            del chunk["usage"]
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    def end(self, status: str, error_type: str, http_status: int) -> None:
        """The response ended as ``status``: its end time (now, unless the answer set
        it) and how it ended."""
        self.t_end = self.t_end or time.perf_counter()
        self.status, self.error_type, self.http_status = status, error_type, http_status

    @property
    def failed_before_output(self) -> bool:
        """The engine failed (unreachable, refused, broke) before any output reached the
        client: the request is refunded (it does not count as one of the minute's)."""
        return self.status == "error" and self.timing.first is None

    def record_fields(
        self, *, request_id: str, route: Route, endpoint: str, arrival: datetime
    ) -> dict[str, Any]:
        """The RequestRecord of this response to request ``request_id``, served by
        ``route`` on ``endpoint`` (request_record_create's arguments)."""
        t = self.timing
        t_end = self.t_end if self.t_end is not None else time.perf_counter()
        # The engine's latest count (its usage chunk, else the usage of the last chunk
        # relayed); an engine that sent none: its header and the output chunks relayed.
        prompt = token_count(self.usage.get("prompt_tokens")) or self.reported_prompt_tokens
        if "completion_tokens" in self.usage:
            completion = token_count(self.usage["completion_tokens"])
        else:
            completion = t.token_chunks
        ttft_ms = tpot_ms = max_itl_ms = None
        ttft_s = latency.ttft(t.t0, t.first)
        if ttft_s is not None and t.last is not None:
            ttft_ms = 1000 * ttft_s
            per_choice = completion / t.num_choices
            if self.stream:
                tpot_s = latency.tpot(t.first, t.last, per_choice)
                if tpot_s is not None:
                    tpot_ms = 1000 * tpot_s
                if t.token_chunks > 1:
                    max_itl_ms = 1000 * t.max_gap
            elif self.engine_timing is not None:
                tpot_ms, max_itl_ms = self.engine_timing.tpot_ms, self.engine_timing.max_itl_ms
        return {
            "request_id": request_id,
            "model_name": route.model_name,
            "node_name": route.node_name,
            "endpoint": endpoint,
            "stream": self.stream,
            "t_arrival": arrival,
            "t_first_token": (
                None if ttft_ms is None else arrival + timedelta(milliseconds=ttft_ms)
            ),
            "t_end": arrival + timedelta(seconds=t_end - t.t0),
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "ttft_ms": ttft_ms,
            "tpot_ms": tpot_ms,
            "max_itl_ms": max_itl_ms,
            "status": self.status,
            "error_type": self.error_type,
            "http_status": self.http_status,
        }
