import pytest

from shunter.engine.catalog import CATALOG, PRESETS, PUBLISHED, get_model
from shunter.engine.exec.hf_config import ArchConfig

# Published parameter counts (model cards / papers), in billions.
SIZES = {
    "llama-3-8b": 8.03,
    "llama-2-13b": 13.0,
    "mistral-7b": 7.24,
    "mixtral-8x7b": 46.7,
    "qwen2.5-7b": 7.61,
    "qwen2.5-32b": 32.5,
    "qwen3-8b": 8.2,
    "qwen3-32b": 32.8,
    "qwen3-30b-a3b": 30.5,
    "opt-6.7b": 6.7,
    "opt-13b": 13.0,
    "opt-30b": 30.0,
}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_param_count_matches_published_size(name: str) -> None:
    spec = get_model(name)
    assert spec.num_params / 1e9 == pytest.approx(SIZES[name], rel=0.03)


def test_catalog_covers_the_published_list() -> None:
    assert set(SIZES) == set(PUBLISHED)
    assert set(PUBLISHED) <= set(CATALOG)


def test_opt_uses_a_two_matrix_mlp_and_mixtral_two_of_eight_experts() -> None:
    assert not any(CATALOG[n].mlp_gated for n in ("opt-6.7b", "opt-13b", "opt-30b"))
    mixtral = CATALOG["mixtral-8x7b"]
    assert (mixtral.num_experts, mixtral.num_active_experts) == (8, 2)
    # 12.9B parameters touched per token (Mixtral paper).
    active = mixtral.num_layers * mixtral.active_layer_params + mixtral.embedding_params
    assert active / 1e9 == pytest.approx(12.9, rel=0.03)


def test_qwen_32b_block_is_4_mib_at_16_tokens() -> None:
    # SuperInfer §4.3.1: a full block of Qwen2.5-32B (64 layers) is 4 MB.
    assert get_model("qwen2.5-32b").block_bytes(16) == 4 * 1024 * 1024


def test_unknown_model_names_the_choices() -> None:
    with pytest.raises(ValueError, match="llama-3-8b"):
        get_model("gpt-5")


def test_presets_are_the_configs_the_executor_builds() -> None:
    for name, config in PRESETS.items():
        ArchConfig.from_hf(config)  # raises for a family the executor lacks
        assert CATALOG[name].name == name
    assert "opt-6.7b" not in PRESETS and "mixtral-8x7b" in PRESETS
    assert {"tiny-llama", "small-llama", "llama-3-8b", "qwen2.5-32b"} <= set(PRESETS)
