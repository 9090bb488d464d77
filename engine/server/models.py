"""The models a server serves: name, directory, sharing mode, tokenizer, chat template.

A model's chat template comes from its ``tokenizer_config.json`` (``chat_template``),
rendered with Jinja2 in a sandbox. Without one, ``DEFAULT_CHAT_TEMPLATE`` applies:
ChatML with tools (``api.chatml``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from shunter.engine.api.chatml import CHATML_TEMPLATE
from shunter.engine.config import ModelSpec, SloSpec
from shunter.engine.exec.detok import token_bytes

DEFAULT_CHAT_TEMPLATE = CHATML_TEMPLATE
SHARING_MODES = ("spatial", "temporal")


@dataclass(frozen=True)
class ModelArg:
    """One served model as configured: ``name``, directory, sharing mode, priority, the
    SLO class of its requests (None: the engine's default), its KV bounds in bytes
    (``kv_floor`` kept for it alone, None: none; ``kv_ceiling`` None: unbounded) and
    ``max_context``, the most tokens (prompt plus output) a request may take (None: the
    model's own context length; a larger value is cut to it). With ``share_prefixes``
    the prefix cache serves one tenant's cached prompts to another (else each tenant's
    are its own: how fast a prompt is answered could tell a tenant what another sent)."""

    name: str
    path: Path
    sharing: str = "spatial"
    priority: int = 0
    slo: SloSpec | None = None
    kv_floor: int | None = None
    kv_ceiling: int | None = None
    max_context: int | None = None
    share_prefixes: bool = False

    def __post_init__(self) -> None:
        if self.sharing not in SHARING_MODES:
            raise ValueError(
                f"model {self.name!r}: sharing must be one of {', '.join(SHARING_MODES)}, "
                f"got {self.sharing!r}"
            )
        floor = self.kv_floor or 0
        if floor < 0 or (self.kv_ceiling is not None and self.kv_ceiling < floor):
            raise ValueError(f"model {self.name!r}: need 0 <= kv_floor <= kv_ceiling")
        if self.max_context is not None and self.max_context < 1:
            raise ValueError(f"model {self.name!r}: max_context must be a positive token count")


def parse_model_arg(value: str) -> ModelArg:
    """``NAME=DIR[:temporal|spatial]``."""
    name, sep, rest = value.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"expected NAME=DIR[:temporal|spatial], got {value!r}")
    path, colon, mode = rest.rpartition(":")
    if colon and mode in SHARING_MODES:
        return ModelArg(name, Path(path), mode)
    return ModelArg(name, Path(rest))


@dataclass
class ServedModel:
    """A model as the HTTP layer sees it: tokenizer, chat template, context length (the
    configured ``max_context`` within the model's own), and each token's bytes
    (``detok.token_bytes``) for log-probability reports."""

    arg: ModelArg
    spec: ModelSpec
    tokenizer: Tokenizer
    template_source: str
    token_bytes: list[bytes]
    special_tokens: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.arg.name

    @property
    def max_context(self) -> int:
        if self.arg.max_context is None:
            return self.spec.max_context
        return min(self.arg.max_context, self.spec.max_context)

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """``text``'s token ids; ``add_special_tokens`` as the tokenizer's post-processor
        says (a BOS, for Llama-style tokenizers)."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        variables: dict[str, Any] | None = None,
    ) -> str:
        """The prompt for ``messages``, with ``tools`` offered (templates read them as
        ``tools``) and the request's own ``variables`` (vLLM's ``chat_template_kwargs``,
        such as Qwen3's ``enable_thinking``); ValueError when the template refuses them
        (a template may raise on a role order it does not support)."""
        try:
            template = _ENV.from_string(self.template_source)
            text: str = template.render(
                **(variables or {}),
                messages=messages,
                tools=tools,
                add_generation_prompt=True,
                **self.special_tokens,
            )
        except (TemplateError, TypeError, ValueError, LookupError, ArithmeticError) as e:
            # The template is the model's and runs sandboxed: what fails is what the request
            # gave it (its messages, tools and variables).
            raise ValueError(f"the chat template of model {self.name!r} failed: {e}") from None
        return text


def _raise_exception(message: str) -> None:
    """Hugging Face templates call ``raise_exception`` to refuse a conversation."""
    raise TemplateError(message)


_ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_ENV.globals["raise_exception"] = _raise_exception


def load_served_model(arg: ModelArg, spec: ModelSpec) -> ServedModel:
    tokenizer = Tokenizer.from_file(str(arg.path / "tokenizer.json"))
    config: dict[str, Any] = {}
    config_path = arg.path / "tokenizer_config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
    template = config.get("chat_template")
    if not isinstance(template, str):
        template = DEFAULT_CHAT_TEMPLATE
    special = {
        key: value
        for key in ("bos_token", "eos_token")
        if isinstance(value := config.get(key), str)
    }
    return ServedModel(arg, spec, tokenizer, template, token_bytes(tokenizer), special)
