"""``POST /v1/completions`` and ``POST /v1/chat/completions``: parse, run, answer.

Each choice is one engine request (a Stream). Streaming answers are server-sent events,
one ``data: {...}`` chunk per step that made text visible, then ``data: [DONE]``; with
``stream_options.continuous_usage_stats`` (and ``include_usage``) every chunk carries the
usage so far, the tokens generated however many share a chunk (vLLM's option). A
request runs at most ``max_sequences_per_request`` sequences (engine setting). When
the handler ends early (the client went away, the write failed, the server stops) every
choice still running is aborted, which frees its blocks at once. A whole (non-streamed)
answer carries its token times as the engine saw them in ``X-Shunter-Timing``
(``timing``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from shunter.engine.api.errors import ApiError, bad_request, model_not_found, unavailable
from shunter.engine.api.headers import (
    PROMPT_TOKENS_HEADER,
    SLO_HEADER,
    TENANT_HEADER,
    ignored_headers,
    slo_from_header,
)
from shunter.engine.api.jsonbody import parse_json
from shunter.engine.api.protocol import (
    GenerationRequest,
    model_name,
    parse_chat,
    parse_completion,
)
from shunter.engine.api.timing import TIMING_HEADER, response_timing
from shunter.engine.interfaces import Clock
from shunter.engine.memory.prefix import request_salt
from shunter.engine.server.context import REQUEST_ID, STATE, ServerState
from shunter.engine.server.loop import ABORTED, Delta, Stream
from shunter.engine.server.responses import Call, Choice, usage

log = logging.getLogger(__name__)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def read_json(request: web.Request) -> Any:
    """The body as JSON: 413 past the size limit, 400 if not UTF-8 JSON or hostile
    (``jsonbody.parse_json``)."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise ApiError(
            413,
            f"The request body is too large: {e.text}.",
            code="request_too_large",
        ) from None
    return parse_json(raw, max_bytes=None)  # read() has applied the app's client_max_size


# vLLM's extensions beyond the request fields ``protocol`` parses.
EXTRAS = ("return_token_ids",)


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    clock = state.loop.engine.core.clock
    t_arr = clock.now()
    body = await read_json(request)
    name = model_name(body)
    served = state.models.get(name)
    if served is None:
        raise model_not_found(name)
    if state.draining:
        raise unavailable("The engine is draining and admits no requests.")
    extras = {key: body.pop(key) for key in EXTRAS if key in body}
    for key, value in extras.items():
        if not isinstance(value, bool):
            raise bad_request(f"'{key}' must be a boolean.", key)
    max_sequences = state.settings.max_sequences_per_request
    parse = parse_chat if chat else parse_completion
    gen = parse(body, served, max_sequences=max_sequences)
    if gen.ignored:
        log.warning(
            "request %s: unknown parameters ignored: %s", request[REQUEST_ID], gen.ignored[:16]
        )
    state.check_capacity(gen)
    slo = slo_from_header(
        request.headers.get(SLO_HEADER), state.slo_of(name), state.settings.slo_classes
    )
    tenant = request.headers.get(TENANT_HEADER, "")
    salt = request_salt(tenant, gen.cache_salt, across_tenants=served.arg.share_prefixes)
    call = Call(chat, request[REQUEST_ID], served, extras, gen.logprobs_shown, gen.structure)
    loop = asyncio.get_running_loop()
    sink: asyncio.Queue[tuple[int, Delta]] = asyncio.Queue()
    streams = []
    choices = []
    for p, prompt in enumerate(gen.prompts):
        for i in range(gen.runs_per_prompt):
            index = p * gen.runs_per_prompt + i
            params = gen.params
            if params.seed is not None and i:
                params = dataclasses.replace(params, seed=(params.seed + i) % 2**63)
            streams.append(
                Stream(
                    index,
                    name,
                    prompt,
                    params,
                    slo,
                    sink,
                    loop,
                    t_arr,
                    tenant,
                    salt,
                    whole=not gen.stream,
                )
            )
            choices.append(Choice(index, len(prompt)))
    engine_loop = state.loop
    engine_loop.submit(streams)
    try:
        if gen.stream:
            return await _stream(request, call, gen, choices, sink)
        return await _collect(call, gen, choices, sink, streams, clock)
    finally:
        for stream, c in zip(streams, choices, strict=True):
            if c.finish_reason is None:
                engine_loop.abort(stream)


async def _deltas(
    choices: list[Choice],
    sink: asyncio.Queue[tuple[int, Delta]],
    *,
    on_idle: Callable[[], Awaitable[None]] | None = None,
    idle_s: float = 0.0,
) -> AsyncIterator[tuple[Choice, Delta]]:
    """The choices' deltas as they come; ``on_idle`` runs after each ``idle_s`` seconds
    without one."""
    left = len(choices)
    while left:
        if on_idle is None or not sink.empty():
            # A delta already waiting is taken without a timer: wait_for costs a task and
            # a timer handle per call, on the loop that serves every stream.
            index, delta = await sink.get()
        else:
            try:
                index, delta = await asyncio.wait_for(sink.get(), idle_s)
            except TimeoutError:
                await on_idle()
                continue
        c = choices[index]
        c.text += delta.text
        c.token_ids += delta.token_ids
        c.logprobs += delta.logprobs
        if delta.finish_reason is not None:
            c.finish_reason, c.stop_reason = delta.finish_reason, delta.stop_reason
            left -= 1
        yield c, delta


async def _collect(
    call: Call,
    gen: GenerationRequest,
    choices: list[Choice],
    sink: asyncio.Queue[tuple[int, Delta]],
    streams: list[Stream],
    clock: Clock,
) -> web.Response:
    """The whole answer, with ``X-Shunter-Timing`` (its token times as the engine saw
    them: nobody downstream can see them in a whole response)."""
    async for _, delta in _deltas(choices, sink):
        if delta.finish_reason == ABORTED:
            raise unavailable(f"The request was aborted: {delta.error}")
    # Every choice has finished: the engine thread no longer touches its Request.
    requests = [s.request for s in streams if s.request is not None]
    timing = response_timing(requests, clock.now())
    body = call.envelope(
        [
            call.choice(c, c.text, c.token_ids, c.finish_reason, chunk=False, logprobs=c.logprobs)
            for c in best_choices(choices, gen.n, gen.runs_per_prompt)
        ],
        chunk=False,
    )
    body["usage"] = usage(choices, gen.prompts)  # every sequence run, returned or not
    headers = answer_headers(gen)
    if timing is not None:
        headers[TIMING_HEADER] = timing.header()
    return web.json_response(body, headers=headers)


def best_choices(choices: list[Choice], n: int, best_of: int) -> list[Choice]:
    """Of each prompt's ``best_of`` choices (consecutive), the ``n`` with the highest
    cumulative log-probability, in that order and indexed anew; all of them when
    ``best_of`` is ``n``."""
    if best_of == n:
        return choices
    kept = []
    for start in range(0, len(choices), best_of):
        group = choices[start : start + best_of]
        group.sort(key=lambda c: -sum(lp.logprob for lp in c.logprobs))
        for rank, c in enumerate(group[:n]):
            c.index = start // best_of * n + rank
            kept.append(c)
    return kept


def answer_headers(gen: GenerationRequest) -> dict[str, str]:
    """``X-Shunter-Prompt-Tokens`` (the prompt tokens of every prompt, as in usage) and
    the ignored fields' headers."""
    return {
        PROMPT_TOKENS_HEADER: str(sum(len(p) for p in gen.prompts)),
        **ignored_headers(gen.ignored),
    }


async def _stream(
    request: web.Request,
    call: Call,
    gen: GenerationRequest,
    choices: list[Choice],
    sink: asyncio.Queue[tuple[int, Delta]],
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Request-Id": request[REQUEST_ID],
            **answer_headers(gen),
        }
    )
    await response.prepare(request)

    async def keep_alive() -> None:
        # An SSE comment: proxies and clients see a slow engine (queued, rotary
        # requests), not a wedged one.
        await response.write(b": keep-alive\n\n")

    prompt_tokens = sum(len(p) for p in gen.prompts)
    generated = 0  # tokens of every choice so far (the deltas taken)

    async def send(payload: dict[str, Any]) -> None:
        if gen.continuous_usage:
            payload["usage"] = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": generated,
                "total_tokens": prompt_tokens + generated,
            }
        elif gen.include_usage:
            payload["usage"] = None
        await response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")

    try:
        started: set[int] = set()
        keepalive_s = request.app[STATE].keepalive_s
        async for c, delta in _deltas(choices, sink, on_idle=keep_alive, idle_s=keepalive_s):
            if delta.finish_reason == ABORTED:
                error = unavailable(f"The request was aborted: {delta.error}")
                await response.write(b"data: " + json.dumps(error.body()).encode() + b"\n\n")
                break
            first = c.index not in started
            started.add(c.index)
            if call.chat and first:
                await send(
                    call.envelope(
                        [call.choice(c, "", [], None, chunk=True, first=True)], chunk=True
                    )
                )
            generated += len(delta.token_ids)  # counted from the chunk that carries them
            held = call.holds_text and delta.finish_reason is None  # sent whole at the end
            if not held and (delta.text or delta.finish_reason is not None or delta.token_ids):
                finish = delta.finish_reason
                await send(
                    call.envelope(
                        [
                            call.choice(
                                c,
                                delta.text,
                                delta.token_ids,
                                finish,
                                chunk=True,
                                logprobs=delta.logprobs,
                            )
                        ],
                        chunk=True,
                    )
                )
        else:
            if gen.include_usage:
                final = call.envelope([], chunk=True)
                final["usage"] = usage(choices, gen.prompts)
                await response.write(b"data: " + json.dumps(final).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:
        # The client left between two writes, before the handler was cancelled: its
        # streams are aborted by the caller, and aiohttp closes the response quietly.
        pass
    return response
