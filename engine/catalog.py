"""The models Shunter knows by name, in one table of Hugging Face ``config.json`` fields.

``PUBLISHED`` holds public models, each as its published ``config.json`` describes it;
``shunter model init`` adds tiny presets that exercise every architecture feature the
executor supports (GQA, llama3 and linear RoPE scaling, tied embeddings, qkv bias, Qwen3's
q/k norms, Mixtral's and Qwen3-MoE's experts, a sliding window shorter than a test's
context) at sizes a CPU runs in milliseconds, and ``small-llama`` for CPU benchmarks.
Everything else derives from these configs: the executor's presets (``PRESETS``, the
families it builds) and the simulator's sizes (``CATALOG``, every model). Pure logic: no
torch.
"""

from __future__ import annotations

from typing import Any

from shunter.engine.config import ModelSpec
from shunter.engine.exec.hf_config import DTYPE_BYTES, FAMILIES, model_spec_from_config

# Safetensors files are cut at about this size, as published checkpoints are.
DEFAULT_SHARD_BYTES = 5 * 1024**3

ARCHITECTURES = {
    "llama": "Llama",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "qwen3_moe": "Qwen3Moe",
    "mistral": "Mistral",
    "mixtral": "Mixtral",
}


def _config(model_type: str, **fields: Any) -> dict[str, Any]:
    architecture = ARCHITECTURES[model_type]
    return {
        "architectures": [f"{architecture}ForCausalLM"],
        "model_type": model_type,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **fields,
    }


def _tiny(model_type: str, **fields: Any) -> dict[str, Any]:
    return _config(
        model_type,
        **{
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 176,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5,
            "torch_dtype": "float32",
            **fields,
        },
    )


def _qwen3(model_type: str, **fields: Any) -> dict[str, Any]:
    """A published Qwen3 config (dense or MoE): the fields every size shares, from the
    Qwen/Qwen3-* config.json files, then ``fields``."""
    return _config(
        model_type,
        vocab_size=151936,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        use_sliding_window=False,
        attention_bias=False,
        **fields,
    )


def _opt(**fields: Any) -> dict[str, Any]:
    return {
        "architectures": ["OPTForCausalLM"],
        "model_type": "opt",
        "activation_function": "relu",
        "vocab_size": 50272,
        "max_position_embeddings": 2048,
        "do_layer_norm_before": True,
        "word_embed_proj_dim": fields["hidden_size"],
        "tie_word_embeddings": True,
        "torch_dtype": "float16",
        **fields,
    }


# Built by ``shunter model init`` for tests and CPU benchmarks.
_BUILT: dict[str, dict[str, Any]] = {
    "tiny-llama": _tiny(
        "llama",
        rope_theta=500000.0,
        # A short original context so that the llama3 rescaling changes real frequencies.
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "tiny-qwen2": _tiny(
        "qwen2", rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False
    ),
    # Qwen3's q/k norms; head_dim 32 is not hidden_size / heads (16), as in Qwen3-0.6B.
    "tiny-qwen3": _tiny(
        "qwen3",
        head_dim=32,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
        attention_bias=False,
    ),
    # Four experts, two per token: each token's choice shows in the logits.
    "tiny-mixtral": _tiny(
        "mixtral",
        num_local_experts=4,
        num_experts_per_tok=2,
        rope_theta=1000000.0,
        sliding_window=None,
    ),
    # Qwen3's attention and eight experts of another width than the dense MLP's.
    "tiny-qwen3-moe": _tiny(
        "qwen3_moe",
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        rope_theta=1000000.0,
        use_sliding_window=False,
        attention_bias=False,
    ),
    "tiny-mistral": _tiny(
        "mistral",
        num_key_value_heads=1,
        rope_theta=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        sliding_window=24,
    ),
    # About 102M parameters: big enough for CPU benchmarks to be dominated by matmuls.
    "small-llama": _config(
        "llama",
        vocab_size=8192,
        hidden_size=768,
        intermediate_size=2560,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        torch_dtype="float32",
    ),
}

# Each published model's config.json, the fields that size and build it. The parameter
# counts in the comments are the model cards' (tests/engine/test_catalog.py holds them).
PUBLISHED: dict[str, dict[str, Any]] = {
    # meta-llama/Meta-Llama-3-8B: 8.03B parameters.
    "llama-3-8b": _config(
        "llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
    ),
    # meta-llama/Llama-2-13b-hf: 13.0B parameters.
    "llama-2-13b": _config(
        "llama",
        vocab_size=32000,
        hidden_size=5120,
        intermediate_size=13824,
        num_hidden_layers=40,
        num_attention_heads=40,
        num_key_value_heads=40,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    ),
    # mistralai/Mistral-7B-v0.1: 7.24B parameters.
    "mistral-7b": _config(
        "mistral",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        sliding_window=4096,
    ),
    # mistralai/Mixtral-8x7B-v0.1: 46.7B parameters, 12.9B active per token.
    "mixtral-8x7b": _config(
        "mixtral",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
    ),
    # Qwen/Qwen2.5-7B: 7.61B parameters.
    "qwen2.5-7b": _config(
        "qwen2",
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=131072,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        use_sliding_window=False,
    ),
    # Qwen/Qwen2.5-32B: 32.5B parameters.
    "qwen2.5-32b": _config(
        "qwen2",
        vocab_size=152064,
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        use_sliding_window=False,
    ),
    # Qwen/Qwen3-8B: 8.2B parameters.
    "qwen3-8b": _qwen3(
        "qwen3",
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
    ),
    # Qwen/Qwen3-32B: 32.8B parameters.
    "qwen3-32b": _qwen3(
        "qwen3",
        hidden_size=5120,
        intermediate_size=25600,
        num_hidden_layers=64,
        num_attention_heads=64,
        num_key_value_heads=8,
    ),
    # Qwen/Qwen3-30B-A3B: 30.5B parameters, 3.3B active per token.
    "qwen3-30b-a3b": _qwen3(
        "qwen3_moe",
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
    ),
    # facebook/opt-6.7b: 6.7B parameters; a two-matrix ReLU MLP, tied output head.
    "opt-6.7b": _opt(hidden_size=4096, ffn_dim=16384, num_hidden_layers=32, num_attention_heads=32),
    # facebook/opt-13b: 13B parameters.
    "opt-13b": _opt(hidden_size=5120, ffn_dim=20480, num_hidden_layers=40, num_attention_heads=40),
    # facebook/opt-30b: 30B parameters.
    "opt-30b": _opt(hidden_size=7168, ffn_dim=28672, num_hidden_layers=48, num_attention_heads=56),
}


CONFIGS: dict[str, dict[str, Any]] = {**_BUILT, **PUBLISHED}

# What ``shunter model init`` can fill with random weights: the families the executor runs.
PRESETS: dict[str, dict[str, Any]] = {
    name: config for name, config in CONFIGS.items() if config["model_type"] in FAMILIES
}


def spec_from_config(config: dict[str, Any], name: str) -> ModelSpec:
    """The ModelSpec of any config in the table: the executor's families as
    ``model_spec_from_config`` reads them, and OPT (only the simulator runs it: a
    two-matrix MLP, every head its own KV head). Biases (Qwen2's q/k/v, OPT's linears
    and layer norms) and OPT's learned position embeddings are not part of ModelSpec;
    they are well under 1% of the parameters."""
    if config["model_type"] in FAMILIES:
        return model_spec_from_config(config, name)
    if config["model_type"] != "opt":
        raise ValueError(f"{name}: no sizes for model_type {config['model_type']!r}")
    heads = config["num_attention_heads"]
    return ModelSpec(
        name=name,
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=config["hidden_size"] // heads,
        hidden_size=config["hidden_size"],
        intermediate_size=config["ffn_dim"],
        vocab_size=config["vocab_size"],
        dtype_bytes=DTYPE_BYTES[config["torch_dtype"]],
        mlp_gated=False,
        tie_embeddings=config["tie_word_embeddings"],
        max_context=config["max_position_embeddings"],
    )


CATALOG: dict[str, ModelSpec] = {
    name: spec_from_config(config, name) for name, config in CONFIGS.items()
}


def get_model(name: str) -> ModelSpec:
    """The catalog entry called ``name``; ValueError naming the choices otherwise."""
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}: choose one of {sorted(CATALOG)}") from None
