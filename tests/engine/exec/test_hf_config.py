"""Architecture facts from Hugging Face configs, and RoPE frequencies as transformers has them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from shunter.engine.catalog import PRESETS
from shunter.engine.exec.hf_config import (
    ArchConfig,
    eos_token_ids,
    model_spec_from_config,
    rope_from_hf,
)
from shunter.engine.exec.rotary import inverse_frequencies


def test_model_spec_takes_the_serving_dtype() -> None:
    spec = model_spec_from_config(PRESETS["tiny-llama"], "tiny")
    assert (spec.dtype_bytes, spec.head_dim, spec.num_kv_heads) == (4, 16, 2)
    assert model_spec_from_config(PRESETS["tiny-llama"], "t", dtype="bfloat16").dtype_bytes == 2
    assert model_spec_from_config(PRESETS["tiny-qwen2"], "q").tie_embeddings


def test_family_flags() -> None:
    qwen = ArchConfig.from_hf(PRESETS["qwen2.5-7b"])
    assert (qwen.qkv_bias, qwen.o_bias, qwen.sliding_window) == (True, False, None)
    mistral = ArchConfig.from_hf(PRESETS["mistral-7b"])
    assert (mistral.qkv_bias, mistral.sliding_window) == (False, 4096)
    llama = ArchConfig.from_hf({**PRESETS["llama-3-8b"], "attention_bias": True})
    assert (llama.qkv_bias, llama.o_bias, llama.head_dim) == (True, True, 128)


def test_both_rope_formats_parse_alike() -> None:
    legacy = {"rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 4.0}}
    current = {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0}}
    assert rope_from_hf(legacy) == rope_from_hf(current)
    assert rope_from_hf({}).rope_type == "default"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type"),
        ({"num_key_value_heads": 3}, "multiple"),
        ({"torch_dtype": "int8"}, "dtype"),
    ],
)
def test_unsupported_configs_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ArchConfig.from_hf({**PRESETS["tiny-llama"], **change})


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "linear", "factor": 2.5},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ],
)
@pytest.mark.parametrize("head_dim", [16, 128])
def test_inverse_frequencies_equal_transformers(
    scaling: dict[str, Any] | None, head_dim: int
) -> None:
    config = {
        **PRESETS["llama-3-8b"],
        "head_dim": head_dim,
        "rope_theta": 500000.0,
        "rope_scaling": scaling,
    }
    hf_config = AutoConfig.for_model(**config)
    rope_type = scaling["rope_type"] if scaling else "default"
    if rope_type == "default":
        expected = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))
    ours = inverse_frequencies(ArchConfig.from_hf(config).rope, head_dim)
    torch.testing.assert_close(ours, expected)


def test_hf_config_needs_no_torch() -> None:
    code = (
        "import sys, shunter.engine.exec.hf_config, shunter.engine.exec.params; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_eos_ids_come_from_the_generation_config_first(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert eos_token_ids(tmp_path) == (7,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 9]}))
    assert eos_token_ids(tmp_path) == (3, 9)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "generation_config.json").write_text("{}")
    assert eos_token_ids(tmp_path) == ()
