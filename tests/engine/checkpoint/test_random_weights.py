"""``shunter model init`` writes Hugging Face directories that every loader reads."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from shunter.engine.catalog import PRESETS
from shunter.engine.checkpoint.random_weights import init_model_dir, parameter_shapes, preset_config
from shunter.engine.exec.hf_config import ArchConfig, model_spec_from_config
from shunter.engine.exec.loader import load_model
from shunter.project.cli import main

CPU = torch.device("cpu")


def checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def test_directory_has_the_hugging_face_files(tiny_dirs: dict[str, Path]) -> None:
    names = {p.name for p in tiny_dirs["tiny-llama"].iterdir()}
    assert names == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_transformers_loads_tokenizer_and_model(name: str, tiny_dirs: dict[str, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs[name])
    text = "The shunter 🚂 moves 列车."
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert (ids[0] == tokenizer.bos_token_id) is (name == "tiny-llama")
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs[name], dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert torch.isfinite(logits).all()
    assert logits.std() > 0.1  # random, yet not a constant


def test_config_carries_the_tokenizer_ids(tiny_dirs: dict[str, Path]) -> None:
    config = json.loads((tiny_dirs["tiny-llama"] / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs["tiny-llama"])
    assert config["bos_token_id"] == tokenizer.bos_token_id
    assert config["eos_token_id"] == tokenizer.eos_token_id
    assert len(tokenizer) <= config["vocab_size"]


def test_the_seed_decides_the_weights(tmp_path: Path, tiny_dirs: dict[str, Path]) -> None:
    again = checkpoint(init_model_dir(tmp_path / "a", config=preset_config("tiny-llama"), seed=0))
    other = checkpoint(init_model_dir(tmp_path / "b", config=preset_config("tiny-llama"), seed=1))
    first = checkpoint(tiny_dirs["tiny-llama"])
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["lm_head.weight"], other["lm_head.weight"])


def test_sharded_directory_loads_the_same_weights(
    tmp_path: Path, tiny_dirs: dict[str, Path]
) -> None:
    sharded = init_model_dir(
        tmp_path / "sharded", config=preset_config("tiny-llama"), seed=0, max_shard_bytes=100_000
    )
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert len(files) > 2 and set(index["weight_map"].values()) == set(files)
    whole = checkpoint(tiny_dirs["tiny-llama"])
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in whole.values())
    ours = load_model(sharded, device=CPU)
    reference = load_model(tiny_dirs["tiny-llama"], device=CPU)
    assert torch.equal(ours.weights.layers[1].gate_up, reference.weights.layers[1].gate_up)
    hf = AutoModelForCausalLM.from_pretrained(sharded, dtype=torch.float32)
    assert torch.equal(hf.lm_head.weight, whole["lm_head.weight"])


def test_a_non_empty_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        init_model_dir(tmp_path, config=preset_config("tiny-llama"))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_describes_its_parameters(name: str) -> None:
    """The tensors written add up to the ModelSpec's count (plus biases it omits)."""
    config = preset_config(name)
    arch = ArchConfig.from_hf(config)
    total = sum(math.prod(s) for s in parameter_shapes(arch).values())
    biases = arch.num_layers * (arch.q_size + 2 * arch.kv_size) if arch.qkv_bias else 0
    assert total == model_spec_from_config(config, name).num_params + biases


def test_small_llama_has_about_100m_parameters() -> None:
    spec = model_spec_from_config(PRESETS["small-llama"], "small-llama")
    assert 90e6 < spec.num_params < 110e6


def test_cli_writes_a_preset_and_a_config_file(tmp_path: Path) -> None:
    assert main(["model", "init", "--preset", "tiny-qwen2", "--out", str(tmp_path / "q")]) == 0
    assert load_model(tmp_path / "q", device=CPU).arch.family == "qwen2"
    config_file = tmp_path / "mistral.json"
    config = {**PRESETS["tiny-mistral"], "num_hidden_layers": 1, "sliding_window": None}
    config_file.write_text(json.dumps(config))
    out = tmp_path / "m"
    args = ["model", "init", "--config", str(config_file), "--out", str(out), "--seed", "3"]
    assert main(args) == 0
    loaded = load_model(out, device=CPU)
    assert (loaded.arch.num_layers, loaded.arch.sliding_window) == (1, None)


def test_cli_layers_override_the_presets_depth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "deep"
    assert (
        main(["model", "init", "--preset", "tiny-llama", "--layers", "6", "--out", str(out)]) == 0
    )
    assert load_model(out, device=CPU).arch.num_layers == 6
    assert (
        main(["model", "init", "--preset", "tiny-llama", "--layers", "0", "--out", str(out)]) == 2
    )
    assert "--layers must be at least 1" in capsys.readouterr().err


def test_cli_rejects_an_unknown_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["model", "init", "--preset", "gpt-5", "--out", str(tmp_path)])
    assert "tiny-llama" in capsys.readouterr().err


def test_the_cli_parser_does_not_import_torch() -> None:
    code = (
        "import sys; from shunter.project.cli import build_parser; build_parser(); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_weights_are_as_readable_as_the_files_beside_them(tmp_path: Path) -> None:
    out = init_model_dir(
        tmp_path / "m", config=preset_config("tiny-llama"), seed=0, max_shard_bytes=200_000
    )
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    weights = [name for name in modes if name.endswith(".safetensors")]
    assert len(weights) > 1  # sharded: every shard
    assert {modes[n] for n in weights} == {modes["config.json"]}
