"""Served models: the chat template from ``tokenizer_config.json``, or ChatML."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from shunter.engine.api.errors import ApiError
from shunter.engine.api.protocol import parse_chat, parse_completion
from shunter.engine.exec.hf_config import model_spec_from_config, read_config
from shunter.engine.server.models import (
    DEFAULT_CHAT_TEMPLATE,
    ModelArg,
    ServedModel,
    load_served_model,
)

ROLES_AND_CONTENT = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"


def with_template(source: Path, dest: Path, template: str) -> tuple[ServedModel, dict[str, Any]]:
    """``source``'s model copied to ``dest`` with ``template`` as its chat template, served;
    and its tokenizer config."""
    shutil.copytree(source, dest)
    config = json.loads((dest / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    spec = model_spec_from_config(read_config(source), "m")
    return load_served_model(ModelArg("m", dest), spec), config


def test_chat_template_from_the_model_or_chatml(
    model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    source = model_dirs["tiny-qwen2"]
    own, _ = with_template(source, tmp_path / "bare", ROLES_AND_CONTENT)
    (tmp_path / "none").mkdir()
    for file in ("config.json", "tokenizer.json"):
        shutil.copy(source / file, tmp_path / "none" / file)
    messages = [{"role": "user", "content": "hi"}]
    spec = model_spec_from_config(read_config(source), "m")
    assert own.render_chat(messages) == "[user]hi"
    default = load_served_model(ModelArg("m", tmp_path / "none"), spec)
    assert default.template_source == DEFAULT_CHAT_TEMPLATE
    assert (
        default.render_chat(messages) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_prompts_keep_the_templates_bos_alone(
    model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    # tiny-llama's tokenizer adds a BOS.
    served, config = with_template(
        model_dirs["tiny-llama"], tmp_path / "llama3", "{{ bos_token }}" + ROLES_AND_CONTENT
    )
    bos = served.tokenizer.token_to_id(config["bos_token"])
    assert served.encode("hi")[0] == bos

    chat = parse_chat(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, served
    )
    prompt = chat.prompts[0]
    assert prompt[0] == bos and prompt.count(bos) == 1
    assert prompt == [bos, *served.encode("[user]hi", add_special_tokens=False)]
    # Completions keep the tokenizer's default: one BOS before the text.
    completion = parse_completion({"model": "m", "prompt": "hi", "max_tokens": 1}, served)
    assert completion.prompts[0] == [bos, *served.encode("hi", add_special_tokens=False)]


def test_chat_template_kwargs_reach_the_template(
    model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """vLLM's ``chat_template_kwargs`` (Qwen3's ``enable_thinking``) are the template's
    variables; what they make the template fail on is a 400, not a server error."""
    served, _ = with_template(
        model_dirs["tiny-qwen2"],
        tmp_path / "qwen3",
        ROLES_AND_CONTENT
        + "{% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}"
        + "{{ '[x%d]' % (depth + 1) if depth is defined else '' }}",
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

    def prompt(**kwargs: object) -> list[int]:
        return parse_chat({**body, **kwargs}, served).prompts[0]

    def text(source: str) -> list[int]:
        return served.encode(source, add_special_tokens=False)

    assert prompt() == text("[user]hi")
    assert prompt(chat_template_kwargs={"enable_thinking": False}) == text("[user]hi[no-think]")
    assert prompt(chat_template_kwargs={"enable_thinking": True, "depth": 2}) == text(
        "[user]hi[x3]"
    )
    with pytest.raises(ApiError) as e:
        prompt(chat_template_kwargs={"depth": "two"})  # '"two" + 1' fails in the template
    assert e.value.status == 400 and "chat template" in e.value.message
