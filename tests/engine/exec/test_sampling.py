"""Token selection: greedy, temperature, top-k, top-p, seeds and banned tokens."""

from __future__ import annotations

import pytest
import torch

from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.sampling import (
    apply_penalties,
    filtered_probs,
    request_generator,
    sample,
)

CPU = torch.device("cpu")
VOCAB = 50


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


def run(logits: torch.Tensor, params: list[SamplingParams], steps: int) -> list[list[int]]:
    """Tokens of every row over ``steps`` draws from the same logits, fresh generators."""
    generators = [request_generator(p, CPU) for p in params]
    draws = [sample(logits, params, generators) for _ in range(steps)]
    return [[d[row] for d in draws] for row in range(len(params))]


def test_greedy_is_argmax_and_needs_no_generator() -> None:
    logits = random_logits(4)
    params = [SamplingParams(temperature=0)] * 4
    assert request_generator(params[0], CPU) is None
    assert sample(logits, params, [None] * 4) == logits.argmax(-1).tolist()


def test_seeded_request_is_reproducible_whatever_shares_its_batch() -> None:
    logits = random_logits(5)
    mine = SamplingParams(temperature=0.9, top_p=0.95, top_k=30, seed=1234)
    alone = run(logits[2:3], [mine], steps=20)[0]
    others = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.3),
        mine,
        SamplingParams(temperature=0.5, seed=7),
        SamplingParams(temperature=1.0, top_k=3),
    ]
    assert run(logits, others, steps=20)[2] == alone
    reordered = [others[4], mine, others[0]]
    assert run(logits[[4, 2, 0]], reordered, steps=20)[1] == alone


def test_different_seeds_give_different_draws() -> None:
    logits = torch.zeros(1, VOCAB)
    first = run(logits, [SamplingParams(seed=1)], steps=30)[0]
    second = run(logits, [SamplingParams(seed=2)], steps=30)[0]
    assert first != second


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    logits = random_logits(3, seed=3)
    greedy = logits.argmax(-1).tolist()
    for params in (SamplingParams(top_k=1, seed=0), SamplingParams(top_p=1e-6, seed=0)):
        tokens = run(logits, [params] * 3, steps=10)
        assert all(row == [g] * 10 for row, g in zip(tokens, greedy, strict=True))


def test_top_k_keeps_the_k_most_likely_tokens() -> None:
    logits = random_logits(1, seed=5)
    probs = filtered_probs(logits, [SamplingParams(top_k=4)])
    assert set(torch.nonzero(probs[0]).flatten().tolist()) == set(
        logits[0].topk(4).indices.tolist()
    )


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.05, 0.3, 0.15]]))
    kept = lambda p: torch.nonzero(filtered_probs(logits, [SamplingParams(top_p=p)])[0])  # noqa: E731
    assert kept(0.5).flatten().tolist() == [0]
    assert kept(0.51).flatten().tolist() == [0, 2]
    assert kept(0.79).flatten().tolist() == [0, 2]
    assert kept(0.81).flatten().tolist() == [0, 2, 3]


def test_temperature_sampling_follows_the_softmax() -> None:
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    params = SamplingParams(temperature=1.0, seed=42)
    draws = run(logits, [params], steps=3000)[0]
    freq = torch.bincount(torch.tensor(draws), minlength=3).float() / len(draws)
    torch.testing.assert_close(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.03, rtol=0)
    # A low temperature sharpens the distribution towards the most likely token.
    cold = run(logits, [SamplingParams(temperature=0.2, seed=42)], steps=500)[0]
    assert cold.count(0) > 0.9 * len(cold)


def test_banned_tokens_are_never_produced() -> None:
    logits = torch.zeros(2, VOCAB)
    logits[:, 7] = 10.0
    params = [SamplingParams(temperature=0), SamplingParams(seed=3)]
    generators = [request_generator(p, CPU) for p in params]
    for _ in range(20):
        tokens = sample(logits, params, generators, banned=[[7], [7, 8]])
        assert tokens[0] != 7 and tokens[1] not in (7, 8)


def test_sampling_without_a_generator_is_refused() -> None:
    with pytest.raises(ValueError, match="generator"):
        sample(random_logits(1), [SamplingParams(temperature=1.0)], [None])


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -1},
        {"top_p": 0},
        {"top_k": -1},
        {"max_tokens": 0},
        {"min_tokens": 5, "max_tokens": 4},
        {"stop": ("",)},
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
        {"logprobs": 21},
    ],
)
def test_invalid_params_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**bad)  # type: ignore[arg-type]


def test_penalties_lower_the_logits_of_output_tokens() -> None:
    logits = torch.zeros(3, 5)
    params = [
        SamplingParams(presence_penalty=1.0),
        SamplingParams(frequency_penalty=0.5),
        SamplingParams(),
    ]
    out = apply_penalties(logits, params, [[1, 1, 3], [1, 1, 3], [1, 2]])
    assert out[0].tolist() == [0.0, -1.0, 0.0, -1.0, 0.0]
    assert out[1].tolist() == [0.0, -1.0, 0.0, -0.5, 0.0]
    assert out[2].tolist() == [0.0] * 5
    assert logits.eq(0).all()  # the input is left as it was


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits() -> None:
    logits = torch.tensor([[2.0, -2.0, 2.0, 1.0]])
    params = [SamplingParams(repetition_penalty=2.0)]
    out = apply_penalties(logits, params, [[1]], [[0]])  # token 0 in the prompt, 1 output
    assert out[0].tolist() == [1.0, -4.0, 2.0, 1.0]


def test_logit_bias_can_force_or_ban_a_greedy_token() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0]])
    forced = [SamplingParams(temperature=0.0, logit_bias=((2, 100.0),))]
    assert sample(apply_penalties(logits, forced, [[]]), forced, [None]) == [2]
    banned = [SamplingParams(temperature=0.0, logit_bias=((0, -100.0),))]
    assert sample(apply_penalties(logits, banned, [[]]), banned, [None]) == [1]


def test_min_p_drops_tokens_far_below_the_most_likely() -> None:
    # Probabilities about 0.66, 0.24, 0.09 and 0.01 at temperature 1.
    logits = torch.log(torch.tensor([[0.66, 0.24, 0.09, 0.01]]))
    kept = filtered_probs(logits, [SamplingParams(min_p=0.2)])[0]
    assert (kept > 0).tolist() == [True, True, False, False]
    assert (filtered_probs(logits, [SamplingParams()])[0] > 0).all()


@pytest.mark.parametrize(
    "bad",
    [{"repetition_penalty": 0.0}, {"min_p": 1.5}, {"logit_bias": ((1, 101.0),)}],
)
def test_new_sampling_params_are_checked(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**bad)  # type: ignore[arg-type]
