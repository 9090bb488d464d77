"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions``, checked and turned
into what the engine runs.

Pure parsing, no torch. A body is first read through its typed model (``requests``:
types and bounds, a 400 naming the field); what is checked here needs the model (the
context, the vocabulary, the chat template) or several fields at once. Unknown fields
are ignored and named in the answer's headers
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
from shunter.engine.api.fields import is_int, logit_bias, token_ids
from shunter.engine.api.requests import (
    MAX_STOP,
    ChatCompletionRequest,
    CompletionRequest,
    read_request,
)
from shunter.engine.api.structured import Structure, structure
from shunter.engine.exec.params import SamplingParams

# The default bound of a request's sequences (prompts x n), engine setting
# ``max_sequences_per_request``: half the default running cap (``SchedulerConfig.
# max_running``, 256), so that one request never holds every running slot and another
# tenant's request always finds one (`shunter bench isolation` measured a 256-sequence
# request keeping a quiet tenant's requests waiting for it to finish). The OpenAI API
# bounds ``n`` at 128 too.
MAX_SEQUENCES = 128
# The OpenAI API's default for /v1/completions; chat defaults to the rest of the context.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class Refused:
    """A field the APIs define that this engine does not implement: the 400's message,
    and the values it takes all the same, which ask for what the engine does anyway
    (empty or false, or the field's vLLM default where that is what the engine does).
    A field not sent is taken."""

    message: str
    taken: tuple[Any, ...] = (False, "", [], {})


_GUIDED = (
    "(vLLM's guided decoding, 'structured_outputs' since vLLM 0.12) is not supported: "
    "constrain the answer with 'response_format' (json_object or json_schema)."
)
# What a client may ask that would change the answer, and the engine cannot do: refused
# with a 400 rather than ignored, since an answer that silently lacks it looks right.
UNSUPPORTED: dict[str, Refused] = {
    "echo": Refused("'echo' (returning the prompt with the completion) is not supported."),
    "suffix": Refused("'suffix' (text after the insertion point) is not supported."),
    "functions": Refused(
        "'functions' (deprecated function calling) is not supported: use 'tools'."
    ),
    "function_call": Refused(
        "'function_call' (deprecated function calling) is not supported: use 'tool_choice'."
    ),
    "structured_outputs": Refused(
        "'structured_outputs' (vLLM's choice, regex, json and grammar constraints) is not "
        "supported: constrain the answer with 'response_format' (json_object or "
        "json_schema)."
    ),
    **{
        name: Refused(f"'{name}' {_GUIDED}")
        for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
    },
    "structural_tag": Refused(f"'structural_tag' {_GUIDED}"),
    "use_beam_search": Refused("'use_beam_search' (beam search) is not supported."),
    "include_stop_str_in_output": Refused(
        "'include_stop_str_in_output' is not supported: a stop string is left out of the output."
    ),
    "skip_special_tokens": Refused(
        "'skip_special_tokens' other than true is not supported: special tokens are left out of "
        "the text.",
        taken=(True,),
    ),
    "truncate_prompt_tokens": Refused(
        "'truncate_prompt_tokens' is not supported: a prompt is taken whole, and refused "
        "when it leaves no room in the context."
    ),
    "prompt_logprobs": Refused("'prompt_logprobs' is not supported."),
    "allowed_token_ids": Refused(
        "'allowed_token_ids' is not supported: bias tokens with 'logit_bias'."
    ),
    "bad_words": Refused("'bad_words' is not supported: bias tokens with 'logit_bias'."),
    "logits_processors": Refused("'logits_processors' is not supported."),
    "return_tokens_as_token_ids": Refused(
        "'return_tokens_as_token_ids' is not supported: 'return_token_ids' gives each "
        "choice's token ids."
    ),
    "prompt_embeds": Refused("'prompt_embeds' is not supported: send text or token ids."),
    "priority": Refused(
        "A request's own 'priority' is not supported: the engine orders requests by their "
        "tenant's priority.",
        taken=(0,),
    ),
    # Chat only (``ChatCompletionRequest``).
    "add_generation_prompt": Refused(
        "'add_generation_prompt' other than true is not supported: the chat template always "
        "opens the assistant's turn.",
        taken=(True,),
    ),
    "continue_final_message": Refused(
        "'continue_final_message' is not supported: the answer is a new assistant turn."
    ),
    "chat_template": Refused(
        "'chat_template' is not supported: the model's own chat template is used."
    ),
}
ROLES = ("system", "user", "assistant", "tool", "developer")
# What the engine gives a chat template itself; ``chat_template_kwargs`` adds the rest.
TEMPLATE_VARIABLES = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception"}
)


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
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        variables: dict[str, Any] | None = None,
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
    cache_salt: str | None = None  # prefix caching shares KV only with the same salt

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
    req = read_request(body, chat=False)
    assert isinstance(req, CompletionRequest)
    _refuse_unsupported(req)
    texts = _prompt_list(req.prompt)
    _check_sequences(len(texts), max(req.n or 1, req.best_of or 1), max_sequences)
    prompts = [_prompt_ids(p, info) for p in texts]
    shape = structure(body, chat=False)
    return _request(
        req, info, prompts, req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS, req.logprobs, shape
    )


def parse_chat(
    body: dict[str, Any], info: ServedModelInfo, *, max_sequences: int = MAX_SEQUENCES
) -> GenerationRequest:
    """A chat body; a 400 past ``max_sequences`` (n)."""
    req = read_request(body, chat=True)
    assert isinstance(req, ChatCompletionRequest)
    _refuse_unsupported(req)
    _check_sequences(1, req.n or 1, max_sequences)
    if not req.logprobs:
        if req.top_logprobs is not None:
            raise bad_request("'top_logprobs' needs 'logprobs': true.", "top_logprobs")
        logprobs = None
    else:
        logprobs = req.top_logprobs or 0
    messages = _messages(req.messages)
    shape = structure(body, chat=True)
    tools = [t.render() for t in shape.tools] if shape.mode == "auto" else None
    variables = req.chat_template_kwargs or {}
    if taken := sorted(set(variables) & TEMPLATE_VARIABLES):
        raise bad_request(
            f"'chat_template_kwargs' may not set {', '.join(taken)}: the request sets them.",
            "chat_template_kwargs",
        )
    try:
        text = info.render_chat(messages, tools, variables)
    except ValueError as e:
        raise bad_request(str(e), "messages") from None
    # The template writes its own special tokens (a BOS among them): adding the
    # tokenizer's would double them, as Hugging Face's apply_chat_template avoids.
    prompt = _prompt_ids(text, info, add_special_tokens=False)
    max_tokens = req.max_completion_tokens or req.max_tokens
    return _request(req, info, [prompt], max_tokens, None, logprobs, shape)


def _request(
    req: CompletionRequest | ChatCompletionRequest,
    info: ServedModelInfo,
    prompts: list[list[int]],
    max_tokens: int | None,
    default_max_tokens: int | None,
    logprobs: int | None,
    shape: Structure,
) -> GenerationRequest:
    """The request: ``best_of`` (completions only; None: n) sequences per prompt, of
    which the n of highest cumulative log-probability are returned."""
    logprobs_shown = logprobs is not None
    chat = isinstance(req, ChatCompletionRequest)
    longest = max(len(p) for p in prompts)
    if max_tokens is None:
        max_tokens = info.max_context - longest
        if default_max_tokens is not None:
            max_tokens = min(max_tokens, default_max_tokens)
        if max_tokens <= 0:
            raise bad_request(
                f"This model's maximum context length is {info.max_context} tokens, and "
                f"the prompt has {longest}: no room is left for output.",
                "messages" if chat else "prompt",
            )
    elif longest + max_tokens > info.max_context:
        raise bad_request(
            f"This model's maximum context length is {info.max_context} tokens. However, "
            f"you requested {longest + max_tokens} tokens ({longest} in the prompt, "
            f"{max_tokens} for the completion). Please reduce the prompt or max_tokens.",
            "max_tokens",
        )
    stream = bool(req.stream)
    options = req.stream_options
    include_usage = continuous_usage = False
    if options is not None:
        if not stream:
            raise bad_request("'stream_options' is only allowed with 'stream': true.")
        include_usage = bool(options.include_usage)
        # As vLLM: usage on every chunk only along with the final usage chunk.
        continuous_usage = include_usage and bool(options.continuous_usage_stats)
    n = req.n or 1
    best_of = (req.best_of if isinstance(req, CompletionRequest) else None) or n
    if best_of < n:
        raise bad_request(f"'best_of' must be at least n (here {n}).", "best_of")
    if best_of > n and stream:
        raise bad_request(
            "'best_of' above n cannot be streamed: the best are known last.", "best_of"
        )
    if best_of > n and logprobs is None:
        logprobs = 0  # ranking needs each token's log-probability; the answer leaves them out
    min_tokens = req.min_tokens or 0
    if min_tokens > max_tokens:
        raise bad_request(
            f"'min_tokens' ({min_tokens}) must not exceed max_tokens ({max_tokens}).",
            "min_tokens",
        )
    params = SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(0, req.top_k or 0),  # vLLM's -1 and 0 are both off
        seed=None if req.seed is None else req.seed % 2**63,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop=_stops(req.stop),
        ignore_eos=bool(req.ignore_eos),
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logprobs=logprobs,
        stop_token_ids=token_ids(req.stop_token_ids, "stop_token_ids", info.vocab_size),
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        min_p=req.min_p or 0.0,
        logit_bias=logit_bias(req.logit_bias, info.vocab_size),
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
        ignored=req.ignored,
        structure=shape,
        best_of=best_of,
        logprobs_shown=logprobs_shown,
        cache_salt=req.cache_salt,
    )


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not all(stops):
        raise bad_request("'stop' strings must not be empty.", "stop")
    if len(stops) > MAX_STOP:
        raise bad_request(f"'stop' takes at most {MAX_STOP} strings.", "stop")
    return tuple(stops)


def _check_sequences(prompts: int, n: int, max_sequences: int) -> None:
    """A 400 when ``prompts`` x ``n`` sequences exceed ``max_sequences``: the prompt
    list's length is bounded too, before its prompts are tokenized."""
    if prompts * n > max_sequences:
        raise bad_request(
            f"This request runs {prompts * n} sequences ({prompts} prompts x n={n}); at "
            f"most {max_sequences} are allowed per request.",
            "prompt" if n == 1 or prompts > max_sequences else "n",
        )


def _refuse_unsupported(req: CompletionRequest | ChatCompletionRequest) -> None:
    """A 400 for a field the APIs define and this engine refuses (``UNSUPPORTED``), unless
    it is not sent or sent with a value the engine takes (``Refused.taken``)."""
    for name in sorted(UNSUPPORTED):
        value, refused = getattr(req, name, None), UNSUPPORTED[name]
        if value is not None and not _is_one_of(value, refused.taken):
            raise bad_request(refused.message, name)


def _is_one_of(value: Any, taken: tuple[Any, ...]) -> bool:
    """Whether ``value`` is one of ``taken``, a JSON type for a JSON type: ``0`` is not
    ``false``, nor ``1`` ``true``, as Python's equality would have them."""
    return any(type(value) is type(t) and value == t for t in taken)


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
