"""Hugging Face configs that ``shunter model init`` can fill with random weights.

Tiny presets exercise every architecture feature the executor supports (GQA, llama3 and
linear RoPE scaling, tied embeddings, qkv bias, a sliding window shorter than a test's
context) at sizes a CPU runs in milliseconds. The real shapes follow each model's
published ``config.json``; their token ids for BOS/EOS are replaced by the generated
tokenizer's.
"""

from __future__ import annotations

from typing import Any

# Safetensors files are cut at about this size, as published checkpoints are.
DEFAULT_SHARD_BYTES = 5 * 1024**3


def _config(model_type: str, **fields: Any) -> dict[str, Any]:
    architecture = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}[model_type]
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


PRESETS: dict[str, dict[str, Any]] = {
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
    # meta-llama/Meta-Llama-3-8B
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
    # Qwen/Qwen2.5-7B
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
    # Qwen/Qwen2.5-32B
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
    # mistralai/Mistral-7B-v0.1
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
}
