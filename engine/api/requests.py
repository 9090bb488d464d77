"""The request bodies as typed models (pydantic, as vLLM declares its own): every field the
OpenAI API or vLLM defines for ``/v1/completions`` and ``/v1/chat/completions``, with its
type and bounds. The engine (``protocol``) and the gateway (``gateway.views``) both read
a body through ``read_request``, so a field's type and range is written once and a
mistake is the same 400, naming the field, wherever it is caught.

Validation is strict: JSON types are taken as they are (``true`` is not an integer, ``"2"``
not a number; an integer is a number). A field sent as ``null`` is left out. Fields
neither API defines are kept aside (``model_extra``) and ignored, not refused; the
engine names them in its answer (``headers.ignored_headers``). What depends on the
model (prompt lengths against its context, token ids against its vocabulary, a chat
template) and the cross-field rules are ``protocol``'s.

Pure: no torch, no aiohttp, no Django.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shunter.engine.api.errors import bad_request

MAX_N = 8
MAX_STOP = 4
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 300  # entries, as the OpenAI API bounds it
MAX_COMPLETION_LOGPROBS = 5  # the OpenAI API's bound for /v1/completions
MAX_TOP_LOGPROBS = 20

Bias = Annotated[float, Field(ge=-100, le=100)]
# Fields whose type is a union: one message for the field, not one per alternative.
UNION_MESSAGES = {
    "prompt": "a string, a list of strings, a list of token ids, or a list of such lists",
    "stop": "a string or a list of strings",
    "tool_choice": "'none', 'auto', 'required' or an object naming a function",
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's


class _Request(BaseModel):
    """What both endpoints take."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # vLLM's; -1 or 0: off
    min_p: float | None = Field(None, ge=0.0, le=1.0)  # vLLM's
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1, le=MAX_N)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)  # vLLM's
    logit_bias: dict[str, Bias] | None = Field(None, max_length=MAX_LOGIT_BIAS)
    user: str | None = None
    ignore_eos: bool | None = None  # vLLM's
    min_tokens: int | None = Field(None, ge=0)  # vLLM's
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)  # vLLM's
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None  # ``structured`` reads it
    cache_salt: str | None = Field(None, min_length=1, max_length=256)  # vLLM's
    # Defined by the APIs and refused by this engine (``protocol.UNSUPPORTED``).
    echo: Any = None
    suffix: Any = None
    functions: Any = None
    function_call: Any = None
    # vLLM's, refused unless they ask for what the engine does anyway (``UNSUPPORTED``).
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structural_tag: Any = None
    use_beam_search: Any = None
    include_stop_str_in_output: Any = None
    skip_special_tokens: Any = None
    truncate_prompt_tokens: Any = None
    prompt_logprobs: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    logits_processors: Any = None
    return_tokens_as_token_ids: Any = None
    prompt_embeds: Any = None
    priority: Any = None

    @property
    def ignored(self) -> tuple[str, ...]:
        """The fields neither API defines, sorted."""
        return tuple(sorted(self.model_extra or ()))


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_N)


class ChatCompletionRequest(_Request):
    messages: list[Any]  # ``protocol`` reads each message (roles, content, tool calls)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Any] | None = None  # ``structured`` reads them
    tool_choice: str | dict[str, Any] | None = None
    # vLLM's: more variables for the chat template (Qwen3's ``enable_thinking``).
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's, refused unless they ask for what the engine does anyway (``UNSUPPORTED``).
    add_generation_prompt: Any = None
    continue_final_message: Any = None
    chat_template: Any = None


def read_request(body: Any, *, chat: bool) -> CompletionRequest | ChatCompletionRequest:
    """``body`` (a parsed JSON value) as the endpoint's request; a 400 naming the first
    field that is wrong."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    kind = ChatCompletionRequest if chat else CompletionRequest
    try:
        return kind.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as e:
        raise _refusal(e) from None


def _refusal(error: ValidationError) -> Exception:
    first = error.errors(include_url=False)[0]
    loc = [str(part) for part in first["loc"]]
    field = loc[0] if loc else None
    if first["type"] == "missing":
        return bad_request(f"'{field}' is required.", field)
    if first["type"] == "extra_forbidden":
        return bad_request(f"'{field}' takes no field '{loc[-1]}'.", field)
    if field in UNION_MESSAGES:
        return bad_request(f"'{field}' must be {UNION_MESSAGES[field]}.", field)
    path = ".".join(loc)
    message = first["msg"]
    if message.startswith("Input should be "):
        message = "must be " + message.removeprefix("Input should be ")
    return bad_request(f"'{path}' {message}, got {_shown(first.get('input'))}.", field)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
