"""Write a Hugging Face model directory with random weights (``shunter model init``).

The directory is what a published checkpoint looks like: ``config.json``,
``generation_config.json``, safetensors (one file, or shards plus
``model.safetensors.index.json``), ``tokenizer.json`` and ``tokenizer_config.json``.
The engine, ``transformers`` and any other loader read it the same way.

Weights are drawn from one seeded generator in a fixed order, so a seed always gives the
same model. Scales keep activations of order one through the depth (fan-in scaling,
output projections shrunk by ``sqrt(2 * layers)``) so that random models give finite,
varied logits rather than NaN or a constant.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from shunter.engine.catalog import DEFAULT_SHARD_BYTES, PRESETS
from shunter.engine.checkpoint.tokenizer import write_tokenizer
from shunter.engine.exec.hf_config import ArchConfig
from shunter.engine.exec.loader import TORCH_DTYPES


def init_model_dir(
    out: Path,
    *,
    config: dict[str, Any],
    seed: int = 0,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """Write a model of ``config`` (a Hugging Face config dict) with random weights to ``out``.

    ``out`` must not exist or be empty. Returns ``out``.
    """
    arch = ArchConfig.from_hf(config)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    tokens = write_tokenizer(
        out,
        max_vocab=arch.vocab_size,
        add_bos=arch.family not in ("qwen2", "qwen3", "qwen3_moe"),
        model_max_length=arch.max_position_embeddings,
    )
    config = {**config, "bos_token_id": tokens.bos_id, "eos_token_id": tokens.eos_ids[0]}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": tokens.bos_id, "eos_token_id": list(tokens.eos_ids)}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    _write_weights(out, arch, seed=seed, max_shard_bytes=max_shard_bytes)
    return out


def preset_config(name: str) -> dict[str, Any]:
    """A copy of the named preset's config; KeyError lists the presets."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return json.loads(json.dumps(PRESETS[name]))  # type: ignore[no-any-return]


def parameter_shapes(arch: ArchConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, in Hugging Face names and in writing order."""
    d, q, kv, ff = arch.hidden_size, arch.q_size, arch.kv_size, arch.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (arch.vocab_size, d)}
    for i in range(arch.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (d,)
        for proj, rows in (("q", q), ("k", kv), ("v", kv)):
            shapes[p + f"self_attn.{proj}_proj.weight"] = (rows, d)
            if arch.qkv_bias:
                shapes[p + f"self_attn.{proj}_proj.bias"] = (rows,)
        if arch.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (arch.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (arch.head_dim,)
        shapes[p + "self_attn.o_proj.weight"] = (d, q)
        if arch.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (d,)
        shapes[p + "post_attention_layernorm.weight"] = (d,)
        if arch.num_experts:
            moe, names = arch.expert_names(i)
            shapes[moe + "gate.weight"] = (arch.num_experts, d)
            for e in range(arch.num_experts):
                gate, up, down = (f"{moe}experts.{e}.{n}.weight" for n in names)
                shapes[gate], shapes[up], shapes[down] = (ff, d), (ff, d), (d, ff)
            continue
        shapes[p + "mlp.gate_proj.weight"] = (ff, d)
        shapes[p + "mlp.up_proj.weight"] = (ff, d)
        shapes[p + "mlp.down_proj.weight"] = (d, ff)
    shapes["model.norm.weight"] = (d,)
    if not arch.tie_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, d)
    return shapes


def _random_tensor(
    name: str, shape: tuple[int, ...], arch: ArchConfig, gen: torch.Generator
) -> torch.Tensor:
    values = torch.randn(shape, generator=gen)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * values  # not all ones, so a misapplied norm shows in the logits
    if name.endswith(".bias"):
        return 0.1 * values
    depth = math.sqrt(2 * arch.num_layers)
    if name == "model.embed_tokens.weight":
        # Tied embeddings also produce the logits. At 1/sqrt(hidden) a token's similarity
        # to itself does not outweigh the layers' contribution, so greedy output varies.
        return values / math.sqrt(arch.hidden_size) if arch.tie_embeddings else values
    if name.endswith(("o_proj.weight", "down_proj.weight", "w2.weight")):
        return values / (math.sqrt(shape[1]) * depth)
    return values / math.sqrt(shape[1])


def _write_weights(out: Path, arch: ArchConfig, *, seed: int, max_shard_bytes: int) -> None:
    dtype = TORCH_DTYPES[arch.dtype]
    shapes = parameter_shapes(arch)
    shards = list(_shard(shapes, dtype.itemsize, max_shard_bytes))
    gen = torch.Generator().manual_seed(seed)
    weight_map: dict[str, str] = {}
    for index, names in enumerate(shards, start=1):
        file = (
            "model.safetensors"
            if len(shards) == 1
            else f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        )
        tensors = {n: _random_tensor(n, shapes[n], arch, gen).to(dtype) for n in names}
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        # safetensors writes its file owner-only (0600); a model directory is read by
        # other users too (an engine container's user), as the JSON files beside it are.
        _readable_as_umask_allows(out / file)
        weight_map.update(dict.fromkeys(names, file))
    if len(shards) > 1:
        total = sum(math.prod(s) for s in shapes.values()) * dtype.itemsize
        index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2) + "\n")


def _readable_as_umask_allows(path: Path) -> None:
    """Give ``path`` the mode a newly created file gets here (0666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def _shard(
    shapes: dict[str, tuple[int, ...]], itemsize: int, max_shard_bytes: int
) -> Iterator[list[str]]:
    """Consecutive names grouped so each group stays within ``max_shard_bytes``
    (a tensor larger than that gets a shard of its own)."""
    group: list[str] = []
    size = 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * itemsize
        if group and size + nbytes > max_shard_bytes:
            yield group
            group, size = [], 0
        group.append(name)
        size += nbytes
    if group:
        yield group
