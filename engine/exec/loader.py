"""Weights of a Hugging Face model directory: safetensors -> host memory -> device.

The host copy (pinned when the device is a CUDA GPU, so copies from it run
asynchronously) holds every weight of the model and stays for the model's lifetime:
parameter remapping streams layers back from it. The device copy is separate storage.

Tensors are kept in the layout the forward pass wants: q, k and v projections fused
into one matrix (one matmul per layer), gate and up likewise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from shunter.engine.exec.hf_config import ArchConfig, read_config

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LayerWeights:
    """One decoder layer. Matrices are ``[out_features, in_features]`` as in nn.Linear.
    A mixture-of-experts layer has a ``router`` ``[experts, hidden]`` and its experts'
    matrices stacked: ``gate_up`` ``[experts, 2 x intermediate, hidden]``, ``down``
    ``[experts, hidden, intermediate]``."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    router: torch.Tensor | None = None

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> LayerWeights:
        """A layer whose every tensor is ``fn`` of this one's (absent ones stay absent)."""

        def opt(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else fn(t)

        return LayerWeights(
            input_norm=fn(self.input_norm),
            qkv=fn(self.qkv),
            qkv_bias=opt(self.qkv_bias),
            o_proj=fn(self.o_proj),
            o_bias=opt(self.o_bias),
            post_norm=fn(self.post_norm),
            gate_up=fn(self.gate_up),
            down=fn(self.down),
            q_norm=opt(self.q_norm),
            k_norm=opt(self.k_norm),
            router=opt(self.router),
        )


@dataclass
class ModelWeights:
    """All weights of a model; ``lm_head`` is ``embed`` itself when embeddings are tied."""

    embed: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor


@dataclass
class LoadedModel:
    """A model ready to run on its own: architecture, host copy and device copy.

    (The engine instead places the device copy in its arena: ``DeviceArena``.)
    """

    arch: ArchConfig
    dtype: torch.dtype
    host: ModelWeights
    weights: ModelWeights


def load_model(
    model_dir: str | Path,
    *,
    device: torch.device,
    dtype: torch.dtype | None = None,
) -> LoadedModel:
    """Load a Llama / Qwen2 / Mistral directory onto ``device``.

    ``dtype`` defaults to the checkpoint's; weights are converted while being read.
    """
    path = Path(model_dir)
    arch = ArchConfig.from_hf(read_config(path))
    dtype = dtype or TORCH_DTYPES[arch.dtype]
    host = load_host_weights(path, arch, dtype=dtype, pin=device.type == "cuda")
    return LoadedModel(
        arch=arch,
        dtype=dtype,
        host=host,
        weights=copy_to_device(host, device),
    )


def load_host_weights(
    model_dir: Path, arch: ArchConfig, *, dtype: torch.dtype, pin: bool
) -> ModelWeights:
    """Read every tensor of the checkpoint into (optionally pinned) host memory."""
    with ExitStack() as stack:
        files = _tensor_files(model_dir)
        handles = {
            file: stack.enter_context(safe_open(str(model_dir / file), framework="pt"))
            for file in sorted(set(files.values()))
        }

        def read(*names: str) -> torch.Tensor:
            """The named tensors concatenated along rows, in one new host tensor."""
            missing = [n for n in names if n not in files]
            if missing:
                raise KeyError(f"{model_dir}: checkpoint lacks {missing}")
            parts = [handles[files[n]].get_tensor(n) for n in names]
            rows = sum(p.shape[0] for p in parts)
            out = torch.empty((rows, *parts[0].shape[1:]), dtype=dtype, pin_memory=pin)
            if len(parts) > 1:
                torch.cat(parts, out=out)
            else:
                out.copy_(parts[0])
            return out

        def layer(i: int) -> LayerWeights:
            p = f"model.layers.{i}."
            attn = p + "self_attn."
            qkv = [attn + f"{x}_proj" for x in "qkv"]
            return LayerWeights(
                input_norm=read(p + "input_layernorm.weight"),
                qkv=read(*(n + ".weight" for n in qkv)),
                qkv_bias=read(*(n + ".bias" for n in qkv)) if arch.qkv_bias else None,
                o_proj=read(attn + "o_proj.weight"),
                o_bias=read(attn + "o_proj.bias") if arch.o_bias else None,
                post_norm=read(p + "post_attention_layernorm.weight"),
                **mlp(i),
                q_norm=read(attn + "q_norm.weight") if arch.qk_norm else None,
                k_norm=read(attn + "k_norm.weight") if arch.qk_norm else None,
            )

        def mlp(i: int) -> dict[str, torch.Tensor]:
            """The MLP's tensors: a dense one's, or a mixture's router and stacked experts
            (``ArchConfig.expert_names``)."""
            p = f"model.layers.{i}."
            if not arch.num_experts:
                return {
                    "gate_up": read(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    "down": read(p + "mlp.down_proj.weight"),
                }
            ff, d = arch.intermediate_size, arch.hidden_size
            moe, (gate, up, down_name) = arch.expert_names(i)
            experts = [moe + f"experts.{e}." for e in range(arch.num_experts)]
            gate_up = read(*(e + f"{w}.weight" for e in experts for w in (gate, up)))
            down = read(*(e + f"{down_name}.weight" for e in experts))
            return {
                "gate_up": gate_up.view(arch.num_experts, 2 * ff, d),
                "down": down.view(arch.num_experts, d, ff),
                "router": read(moe + "gate.weight"),
            }

        embed = read("model.embed_tokens.weight")
        return ModelWeights(
            embed=embed,
            layers=[layer(i) for i in range(arch.num_layers)],
            final_norm=read("model.norm.weight"),
            lm_head=embed if arch.tie_embeddings else read("lm_head.weight"),
        )


def _tensor_files(model_dir: Path) -> dict[str, str]:
    """Tensor name -> safetensors file, from the shard index or the single file."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return weight_map
    single = model_dir / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"{model_dir}: no model.safetensors or shard index")
    with safe_open(str(single), framework="pt") as f:
        return dict.fromkeys(f.keys(), single.name)


Allocate = Callable[[int | None, torch.Tensor], torch.Tensor]
"""Device storage for a tensor shaped like the given host one; the first argument is the
decoder layer it belongs to (``None``: embeddings, final norm and output head)."""


def copy_weights(host: ModelWeights, allocate: Allocate, *, layers: bool = True) -> ModelWeights:
    """A device copy of ``host`` in the storage ``allocate`` hands out, ties preserved
    (without ``layers``: no decoder layer, for callers that place those themselves)."""

    def into(layer: int | None) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda t: allocate(layer, t).copy_(t, non_blocking=True)

    embed = into(None)(host.embed)
    weights = ModelWeights(
        embed=embed,
        layers=[layer.map(into(i)) for i, layer in enumerate(host.layers)] if layers else [],
        final_norm=into(None)(host.final_norm),
        lm_head=embed if host.lm_head is host.embed else into(None)(host.lm_head),
    )
    if embed.device.type == "cuda":
        torch.cuda.synchronize(embed.device)
    return weights


def copy_to_device(host: ModelWeights, device: torch.device) -> ModelWeights:
    """A device copy of ``host`` in fresh tensors (fresh storage on CPU too)."""
    return copy_weights(host, lambda _layer, t: torch.empty_like(t, device=device))
