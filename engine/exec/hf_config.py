"""Architecture facts read from a Hugging Face ``config.json`` (Llama, Qwen2, Qwen3,
Qwen3-MoE, Mistral, Mixtral).

Pure logic: no torch, so the control plane and the simulator can size a model from its
directory without loading it. The executor builds its layers from :class:`ArchConfig`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shunter.engine.config import ModelSpec

# model_type -> family; they share one decoder layer and differ in the flags below.
FAMILIES = {
    "llama": "llama",
    "mistral": "mistral",
    "mixtral": "mixtral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
}
# The mixtures of experts: where the expert count and each expert's width are.
MOE_FIELDS = {
    "mixtral": ("num_local_experts", "intermediate_size"),
    "qwen3_moe": ("num_experts", "moe_intermediate_size"),
}
ROPE_TYPES = ("default", "linear", "llama3")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding: base ``theta`` and the scaling of its inverse frequencies.

    ``rope_type`` "default" leaves them alone, "linear" divides them by ``factor``,
    "llama3" rescales low and medium frequencies (Llama 3.1) using ``low_freq_factor``,
    ``high_freq_factor`` and ``original_max_position_embeddings``.
    """

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope_type {self.rope_type!r}; supported: {ROPE_TYPES}")
        if self.theta <= 0 or self.factor <= 0:
            raise ValueError("rope theta and factor must be positive")
        if self.rope_type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("llama3 rope needs high_freq_factor > low_freq_factor")


@dataclass(frozen=True)
class ArchConfig:
    """One decoder-only model of the Llama family, as its ``config.json`` describes it.

    ``qkv_bias`` is set for Qwen2 (and Llama or Qwen3 with ``attention_bias``), ``o_bias``
    for Llama and Qwen3 with ``attention_bias``. ``qk_norm`` (Qwen3) normalizes each head's
    query and key (RMSNorm over ``head_dim``) before the rotary embedding.
    ``sliding_window`` (Mistral, Mixtral) limits attention to the last ``sliding_window``
    positions, the query's own included; ``None`` means full. ``num_experts`` > 0
    (Mixtral, Qwen3-MoE) makes each MLP a mixture of that many SwiGLU experts of width
    ``intermediate_size``, of which a router picks ``experts_per_token`` per token, their
    outputs weighted by the router's softmax (renormalized over the chosen ones with
    ``renormalize``).
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    sliding_window: int | None
    dtype: str
    qk_norm: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    renormalize: bool = True

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for rotary embeddings")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unsupported dtype {self.dtype!r}; supported: {list(DTYPE_BYTES)}")
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError("num_experts_per_tok must be in [1, num_local_experts]")

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ArchConfig:
        """Parse a Hugging Face config dict; raise ValueError for what we cannot run."""
        model_type = config.get("model_type")
        if model_type not in FAMILIES:
            raise ValueError(f"unsupported model_type {model_type!r}; supported: {list(FAMILIES)}")
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {config['hidden_act']!r}; need silu")
        if config.get("mlp_bias", False):
            raise ValueError("mlp_bias is not supported")
        if model_type == "qwen3_moe" and (
            config.get("mlp_only_layers") or int(config.get("decoder_sparse_step", 1)) != 1
        ):
            raise ValueError("Qwen3-MoE with dense layers (mlp_only_layers) is not supported")
        if model_type in ("qwen2", "qwen3", "qwen3_moe") and config.get("use_sliding_window"):
            raise ValueError(f"{model_type} use_sliding_window is not supported")
        num_heads = int(config["num_attention_heads"])
        attention_bias = model_type != "qwen2" and bool(config.get("attention_bias", False))
        windowed = model_type in ("mistral", "mixtral")
        sliding_window = config.get("sliding_window") if windowed else None
        # transformers >= 5 writes "dtype", older versions "torch_dtype".
        dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
        experts_key, width_key = MOE_FIELDS.get(str(model_type), ("", "intermediate_size"))
        return cls(
            family=FAMILIES[model_type],
            vocab_size=int(config["vocab_size"]),
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config[width_key]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // num_heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope=rope_from_hf(config),
            max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=attention_bias,
            sliding_window=None if sliding_window is None else int(sliding_window),
            dtype=str(dtype),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            num_experts=int(config.get(experts_key, 0)) if experts_key else 0,
            experts_per_token=int(config.get("num_experts_per_tok", 0)),
            renormalize=bool(config.get("norm_topk_prob", True)),
        )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def expert_names(self, layer: int) -> tuple[str, tuple[str, str, str]]:
        """Where a mixture layer's checkpoint tensors are: the MLP module's prefix (its
        router is ``<prefix>gate.weight``, expert E's matrices
        ``<prefix>experts.E.<name>.weight``) and the gate, up and down names. Mixtral
        names them ``block_sparse_moe`` and ``w1``, ``w3``, ``w2``; Qwen3-MoE ``mlp`` and
        ``gate_proj``, ``up_proj``, ``down_proj``."""
        if self.family == "mixtral":
            return f"model.layers.{layer}.block_sparse_moe.", ("w1", "w3", "w2")
        return f"model.layers.{layer}.mlp.", ("gate_proj", "up_proj", "down_proj")


def rope_from_hf(config: dict[str, Any]) -> RopeConfig:
    """RoPE settings from either config format.

    transformers >= 5 writes ``rope_parameters`` (theta inside); published checkpoints
    carry ``rope_theta`` plus an optional ``rope_scaling`` dict.
    """
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    # Older configs name the type "type"; "default" and None both mean unscaled.
    rope_type = params.get("rope_type") or params.get("type") or "default"
    return RopeConfig(
        theta=float(theta),
        rope_type=str(rope_type),
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get(
                "original_max_position_embeddings", config.get("max_position_embeddings", 8192)
            )
        ),
    )


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a model directory as a dict."""
    data: dict[str, Any] = json.loads((Path(model_dir) / "config.json").read_text())
    return data


def model_spec_from_config(
    config: dict[str, Any], name: str, *, dtype: str | None = None
) -> ModelSpec:
    """The engine's ModelSpec of a Hugging Face config (sizes, dtype, context).

    ``dtype`` is the dtype the model is served in when it differs from the checkpoint's.
    """
    arch = ArchConfig.from_hf(config)
    dtype = dtype or arch.dtype
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unsupported dtype {dtype!r}; supported: {list(DTYPE_BYTES)}")
    return ModelSpec(
        name=name,
        num_layers=arch.num_layers,
        num_heads=arch.num_heads,
        num_kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        vocab_size=arch.vocab_size,
        dtype_bytes=DTYPE_BYTES[dtype],
        tie_embeddings=arch.tie_embeddings,
        max_context=arch.max_position_embeddings,
        qk_norm=arch.qk_norm,
        num_experts=arch.num_experts,
        num_active_experts=arch.experts_per_token if arch.num_experts else 0,
    )


def eos_token_ids(model_dir: str | Path) -> tuple[int, ...]:
    """Tokens that end a generation: ``generation_config.json``'s ``eos_token_id``
    (one id or a list), else ``config.json``'s; empty when neither names one."""
    path = Path(model_dir)
    generation = path / "generation_config.json"
    found = json.loads(generation.read_text()).get("eos_token_id") if generation.exists() else None
    if found is None:
        found = read_config(path).get("eos_token_id")
    if found is None:
        return ()
    return tuple(found) if isinstance(found, list) else (int(found),)
