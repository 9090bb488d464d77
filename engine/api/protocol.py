"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions``, checked and turned
into what the engine runs.

Pure parsing, no torch: every mistake in a known field becomes a 400 ``ApiError`` naming
the parameter. Unknown fields are ignored and named in the answer's headers
(``headers.ignored_headers``), as vLLM ignores them; OpenAI and vLLM parameters the
engine does not implement are refused with a 400 saying so (``UNSUPPORTED``); ``store``
is taken and changes nothing; ``response_format``, ``tools`` and ``tool_choice`` are
``structured``'s; ``best_of`` (completions) runs that many sequences per prompt and
returns the ``n`` most likely.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from shunter.engine.api.errors import bad_request
from shunter.engine.api.fields import (
    boolean,
    integer,
    is_int,
    logit_bias,
    min_tokens,
    number,
    stop_strings,
    token_ids,
    top_k,
)
from shunter.engine.api.structured import Structure, structure
from shunter.engine.exec.params import MAX_LOGPROBS, SamplingParams

MAX_N = 8
# The default bound of a request's sequences (prompts x n), engine setting
# ``max_sequences_per_request``: half the default running cap (``SchedulerConfig.
# max_running``, 256), so that one request never holds every running slot and another
# tenant's request always finds one (`shunter bench isolation` measured a 256-sequence
# request keeping a quiet tenant's requests waiting for it to finish). The OpenAI API
# bounds ``n`` at 128 too.
MAX_SEQUENCES = 128
MAX_COMPLETION_LOGPROBS = 5  # the OpenAI API's bound for /v1/completions
# The OpenAI API's default for /v1/completions; chat defaults to the rest of the context.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

_COMMON = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "ignore_eos",
    "min_tokens",
    "logprobs",
    "stop_token_ids",
    "repetition_penalty",
    "min_p",
    "logit_bias",
    # Taken and ignored: nothing here stores completions.
    "store",
    "parallel_tool_calls",  # read with 'tools' (``structured``)
    "response_format",  # ``structured``
}
MAX_STOP_TOKEN_IDS = 64
# What the OpenAI or vLLM API offers and this engine refuses, and why.
UNSUPPORTED = {
    "echo": "'echo' (returning the prompt with the completion) is not supported.",
    "suffix": "'suffix' (text after the insertion point) is not supported.",
    "functions": "'functions' (deprecated function calling) is not supported: use 'tools'.",
    "function_call": "'function_call' (deprecated function calling) is not supported: use "
    "'tool_choice'.",
}
COMPLETION_FIELDS = _COMMON | {"prompt", "best_of"}
CHAT_FIELDS = _COMMON | {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
}
STREAM_OPTIONS = {"include_usage", "continuous_usage_stats"}
ROLES = ("system", "user", "assistant", "tool", "developer")


class ServedModelInfo(Protocol):
    """What parsing needs to know of a served model."""

    @property
    def name(self) -> str: ...

    @property
    def max_context(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str: ...


@dataclass(frozen=True)
class GenerationRequest:
    """A parsed request: ``prompts`` (token ids; several for a completions list), each
    answered with ``n`` choices of ``params``; ``stream``, ``include_usage`` and
    ``continuous_usage`` (usage so far on every chunk, vLLM's ``continuous_usage_stats``)
    say how. ``ignored`` names the body's fields that neither the OpenAI API nor vLLM's
    defines here: they are left out, as vLLM leaves them, and the answer says so."""

    model: str
    prompts: list[list[int]]
    params: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    continuous_usage: bool = False
    ignored: tuple[str, ...] = ()  # unknown fields, left out (``headers.ignored_headers``)
    best_of: int | None = None  # sequences run per prompt (None: n); the n most likely return
    logprobs_shown: bool = False  # whether the answer shows logprobs (ranking forces them)
    structure: Structure = field(default_factory=Structure)  # ``structured``

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def runs_per_prompt(self) -> int:
        """Sequences run for each prompt: ``best_of``, else ``n``."""
        return self.best_of or self.n


def model_name(body: Any) -> str:
    """The ``model`` field of a JSON object body (400 if the body is not one)."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string.", "model")
    return model


def parse_completion(
    body: dict[str, Any], info: ServedModelInfo, *, max_sequences: int = MAX_SEQUENCES
) -> GenerationRequest:
    """A completions body; a 400 past ``max_sequences`` (prompts x n), before any
    prompt is tokenized."""
    ignored = _check_fields(body, COMPLETION_FIELDS)
    logprobs = integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS, None)
    texts = _prompt_list(body.get("prompt"))
    best_of = integer(body, "best_of", 1, MAX_N, None)
    _check_sequences(len(texts), max(_n(body), best_of or 1), max_sequences)
    prompts = [_prompt_ids(p, info) for p in texts]
    default = COMPLETIONS_DEFAULT_MAX_TOKENS
    max_tokens = integer(body, "max_tokens", 1, None, None)
    shape = structure(body, chat=False)
    return _request(body, info, prompts, max_tokens, default, logprobs, ignored, shape, best_of)


def parse_chat(
    body: dict[str, Any], info: ServedModelInfo, *, max_sequences: int = MAX_SEQUENCES
) -> GenerationRequest:
    """A chat body; a 400 past ``max_sequences`` (n)."""
    ignored = _check_fields(body, CHAT_FIELDS)
    _check_sequences(1, _n(body), max_sequences)
    top = integer(body, "top_logprobs", 0, MAX_LOGPROBS, None)
    if not boolean(body, "logprobs", False):
        if top is not None:
            raise bad_request("'top_logprobs' needs 'logprobs': true.", "top_logprobs")
        logprobs = None
    else:
        logprobs = top or 0
    messages = _messages(body.get("messages"))
    shape = structure(body, chat=True)
    tools = [t.render() for t in shape.tools] if shape.mode == "auto" else None
    try:
        text = info.render_chat(messages, tools)
    except ValueError as e:
        raise bad_request(str(e), "messages") from None
    # The template writes its own special tokens (a BOS among them): adding the
    # tokenizer's would double them, as Hugging Face's apply_chat_template avoids.
    prompt = _prompt_ids(text, info, add_special_tokens=False)
    max_tokens = integer(body, "max_completion_tokens", 1, None, None)
    if max_tokens is None:
        max_tokens = integer(body, "max_tokens", 1, None, None)
    return _request(body, info, [prompt], max_tokens, None, logprobs, ignored, shape, None)


def _request(
    body: dict[str, Any],
    info: ServedModelInfo,
    prompts: list[list[int]],
    max_tokens: int | None,
    default_max_tokens: int | None,
    logprobs: int | None,
    ignored: tuple[str, ...],
    shape: Structure,
    best_of: int | None,
) -> GenerationRequest:
    """The request: ``best_of`` (completions only; None: n) sequences per prompt, of
    which the n of highest cumulative log-probability are returned."""
    logprobs_shown = logprobs is not None
    longest = max(len(p) for p in prompts)
    if max_tokens is None:
        max_tokens = info.max_context - longest
        if default_max_tokens is not None:
            max_tokens = min(max_tokens, default_max_tokens)
        if max_tokens <= 0:
            raise bad_request(
                f"This model's maximum context length is {info.max_context} tokens, and "
                f"the prompt has {longest}: no room is left for output.",
                "messages" if "messages" in body else "prompt",
            )
    elif longest + max_tokens > info.max_context:
        raise bad_request(
            f"This model's maximum context length is {info.max_context} tokens. However, "
            f"you requested {longest + max_tokens} tokens ({longest} in the prompt, "
            f"{max_tokens} for the completion). Please reduce the prompt or max_tokens.",
            "max_tokens",
        )
    if "user" in body and not isinstance(body["user"], str):
        raise bad_request("'user' must be a string.", "user")
    stream = boolean(body, "stream", False)
    options = body.get("stream_options")
    include_usage = continuous_usage = False
    if options is not None:
        if not stream:
            raise bad_request("'stream_options' is only allowed with 'stream': true.")
        if not isinstance(options, dict) or set(options) - STREAM_OPTIONS:
            raise bad_request(
                "'stream_options' may only hold 'include_usage' and 'continuous_usage_stats'."
            )
        include_usage = boolean(options, "include_usage", False)
        # As vLLM: usage on every chunk only along with the final usage chunk.
        continuous_usage = include_usage and boolean(options, "continuous_usage_stats", False)
    seed = integer(body, "seed", -(2**63), 2**63 - 1, None)
    n = _n(body)
    best_of = best_of or n
    if best_of < n:
        raise bad_request(f"'best_of' must be at least n (here {n}).", "best_of")
    if best_of > n and stream:
        raise bad_request(
            "'best_of' above n cannot be streamed: the best are known last.", "best_of"
        )
    if best_of > n and logprobs is None:
        logprobs = 0  # ranking needs each token's log-probability; the answer leaves them out
    params = SamplingParams(
        temperature=number(body, "temperature", 0.0, 2.0, 1.0),
        top_p=number(body, "top_p", 0.0, 1.0, 1.0, open_low=True),
        top_k=top_k(body),
        seed=None if seed is None else seed % 2**63,
        max_tokens=max_tokens,
        min_tokens=min_tokens(body, max_tokens),
        stop=stop_strings(body.get("stop")),
        ignore_eos=boolean(body, "ignore_eos", False),
        presence_penalty=number(body, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        logprobs=logprobs,
        stop_token_ids=token_ids(body, "stop_token_ids", info.vocab_size, MAX_STOP_TOKEN_IDS),
        repetition_penalty=number(body, "repetition_penalty", 0.0, 2.0, 1.0, open_low=True),
        min_p=number(body, "min_p", 0.0, 1.0, 0.0),
        logit_bias=logit_bias(body.get("logit_bias"), info.vocab_size),
        grammar=shape.grammar,
    )
    return GenerationRequest(
        model=info.name,
        prompts=prompts,
        params=params,
        n=n,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        ignored=ignored,
        structure=shape,
        best_of=best_of,
        logprobs_shown=logprobs_shown,
    )


def _n(body: dict[str, Any]) -> int:
    return integer(body, "n", 1, MAX_N, 1) or 1


def _check_sequences(prompts: int, n: int, max_sequences: int) -> None:
    """A 400 when ``prompts`` x ``n`` sequences exceed ``max_sequences``: the prompt
    list's length is bounded too, before its prompts are tokenized."""
    if prompts * n > max_sequences:
        raise bad_request(
            f"This request runs {prompts * n} sequences ({prompts} prompts x n={n}); at "
            f"most {max_sequences} are allowed per request.",
            "prompt" if n == 1 or prompts > max_sequences else "n",
        )


def _check_fields(body: dict[str, Any], allowed: set[str]) -> tuple[str, ...]:
    """400 for a field this engine refuses (``UNSUPPORTED``) or a bad ignored one; the
    unknown fields, sorted, which the request goes on without."""
    refused = sorted(
        name for name in body if name in UNSUPPORTED and body[name] not in (None, False, "", [])
    )
    if refused:
        raise bad_request(UNSUPPORTED[refused[0]], refused[0])
    unknown = tuple(sorted(set(body) - allowed - set(UNSUPPORTED)))
    for name in ("store", "parallel_tool_calls"):
        if name in body and body[name] is not None and not isinstance(body[name], bool):
            raise bad_request(f"'{name}' must be a boolean.", name)
    return unknown


def _prompt_list(prompt: Any) -> list[str | list[int]]:
    """A completions prompt: a string, a list of strings, token ids, or lists of them."""
    if isinstance(prompt, str) and prompt:
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(is_int(t) for t in prompt):
            return [prompt]
        if all(isinstance(p, str) and p for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) and p and all(is_int(t) for t in p) for p in prompt):
            return list(prompt)
    raise bad_request(
        "'prompt' must be a string, a list of strings, a list of token ids or a list of "
        "lists of token ids, and must not be empty.",
        "prompt",
    )


def _prompt_ids(
    prompt: str | list[int], info: ServedModelInfo, *, add_special_tokens: bool = True
) -> list[int]:
    if isinstance(prompt, str):
        ids = info.encode(prompt, add_special_tokens=add_special_tokens)
    else:
        ids = list(prompt)
    if not ids:
        raise bad_request("The prompt has no tokens.", "prompt")
    if min(ids) < 0 or max(ids) >= info.vocab_size:
        bad = min(ids) if min(ids) < 0 else max(ids)
        raise bad_request(
            f"Token id {bad} is outside the vocabulary of model {info.name!r} "
            f"({info.vocab_size} tokens).",
            "prompt",
        )
    return ids


def _messages(value: Any) -> list[dict[str, Any]]:
    """The conversation as templates take it: each message's role and text, an
    assistant's ``tool_calls`` (its content may then be null) and a tool message's
    ``tool_call_id``."""
    if not isinstance(value, list) or not value:
        raise bad_request("'messages' must be a non-empty list.", "messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise bad_request(
                f"messages[{i}] must be an object with 'role' one of {', '.join(ROLES)}.",
                "messages",
            )
        calls = message.get("tool_calls")
        content = message.get("content")
        entry: dict[str, Any] = {"role": message["role"]}
        if calls is not None and message["role"] == "assistant":
            entry["tool_calls"] = _tool_calls(calls, i)
            content = "" if content is None else content
        entry["content"] = _content(content, i)
        if message["role"] == "tool" and isinstance(message.get("tool_call_id"), str):
            entry["tool_call_id"] = message["tool_call_id"]
        out.append(entry)
    return out


def _tool_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's earlier calls, each ``{"id", "type": "function",
    "function": {"name", "arguments"}}`` with string arguments (OpenAI's shape)."""
    ok = isinstance(calls, list) and all(
        isinstance(c, dict)
        and isinstance(f := c.get("function"), dict)
        and isinstance(f.get("name"), str)
        and isinstance(f.get("arguments"), str)
        for c in calls
    )
    if not ok:
        raise bad_request(
            f"messages[{i}].tool_calls must be a list of {{'id', 'type': 'function', "
            "'function': {'name', 'arguments': string}}.",
            "messages",
        )
    return [
        {
            "id": c.get("id", ""),
            "type": "function",
            "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
        }
        for c in calls
    ]


def _content(content: Any, i: int) -> str:
    """A message's text: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise bad_request(
        f"messages[{i}].content must be a string or a list of text parts.", "messages"
    )
