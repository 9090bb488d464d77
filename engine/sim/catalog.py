"""Architecture facts of public models, from each model's published ``config.json``.

Biases (Qwen2's q/k/v, OPT's linears and layer norms) and OPT's learned position
embeddings are not part of ModelSpec; they are well under 1% of the parameters.
"""

from __future__ import annotations

from shunter.engine.config import ModelSpec

CATALOG: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # meta-llama/Meta-Llama-3-8B: 8.03B parameters.
        ModelSpec(
            name="llama-3-8b",
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            hidden_size=4096,
            intermediate_size=14336,
            vocab_size=128256,
            max_context=8192,
        ),
        # meta-llama/Llama-2-13b-hf: 13.0B parameters.
        ModelSpec(
            name="llama-2-13b",
            num_layers=40,
            num_heads=40,
            num_kv_heads=40,
            head_dim=128,
            hidden_size=5120,
            intermediate_size=13824,
            vocab_size=32000,
            max_context=4096,
        ),
        # mistralai/Mistral-7B-v0.1: 7.24B parameters.
        ModelSpec(
            name="mistral-7b",
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            hidden_size=4096,
            intermediate_size=14336,
            vocab_size=32000,
            max_context=32768,
        ),
        # mistralai/Mixtral-8x7B-v0.1: 46.7B parameters, 12.9B active per token.
        ModelSpec(
            name="mixtral-8x7b",
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            hidden_size=4096,
            intermediate_size=14336,
            vocab_size=32000,
            num_experts=8,
            num_active_experts=2,
            max_context=32768,
        ),
        # Qwen/Qwen2.5-7B: 7.61B parameters.
        ModelSpec(
            name="qwen2.5-7b",
            num_layers=28,
            num_heads=28,
            num_kv_heads=4,
            head_dim=128,
            hidden_size=3584,
            intermediate_size=18944,
            vocab_size=152064,
            max_context=32768,
        ),
        # Qwen/Qwen2.5-32B: 32.5B parameters.
        ModelSpec(
            name="qwen2.5-32b",
            num_layers=64,
            num_heads=40,
            num_kv_heads=8,
            head_dim=128,
            hidden_size=5120,
            intermediate_size=27648,
            vocab_size=152064,
            max_context=32768,
        ),
        # facebook/opt-6.7b: 6.7B parameters; two-matrix ReLU MLP, tied output head.
        ModelSpec(
            name="opt-6.7b",
            num_layers=32,
            num_heads=32,
            num_kv_heads=32,
            head_dim=128,
            hidden_size=4096,
            intermediate_size=16384,
            vocab_size=50272,
            mlp_gated=False,
            tie_embeddings=True,
            max_context=2048,
        ),
        # facebook/opt-13b: 13B parameters.
        ModelSpec(
            name="opt-13b",
            num_layers=40,
            num_heads=40,
            num_kv_heads=40,
            head_dim=128,
            hidden_size=5120,
            intermediate_size=20480,
            vocab_size=50272,
            mlp_gated=False,
            tie_embeddings=True,
            max_context=2048,
        ),
        # facebook/opt-30b: 30B parameters.
        ModelSpec(
            name="opt-30b",
            num_layers=48,
            num_heads=56,
            num_kv_heads=56,
            head_dim=128,
            hidden_size=7168,
            intermediate_size=28672,
            vocab_size=50272,
            mlp_gated=False,
            tie_embeddings=True,
            max_context=2048,
        ),
    )
}


def get_model(name: str) -> ModelSpec:
    """The catalog entry called ``name``; ValueError naming the choices otherwise."""
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}: choose one of {sorted(CATALOG)}") from None
