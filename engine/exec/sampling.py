"""Token selection for a batch of logits rows, one request per row.

Rows are independent: the filters work row-wise and every random draw of a request
comes from its own ``torch.Generator``, one draw per step, so a seeded request gets the
same tokens whatever else shares its batches.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import torch

from shunter.engine.exec.params import SamplingParams


def request_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """The request's own generator (seeded from ``params.seed`` or at random); greedy
    requests draw nothing and get ``None``."""
    if params.greedy:
        return None
    seed = params.seed if params.seed is not None else secrets.randbits(63)
    return torch.Generator(device=device).manual_seed(seed)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    banned: Sequence[Sequence[int]] = (),
) -> list[int]:
    """One token id per row of ``logits`` ``[num_rows, vocab_size]``.

    ``banned[i]`` lists token ids row i may not produce (EOS before ``min_tokens``).
    Non-greedy rows need their generator.
    """
    if not len(params) == len(generators) == logits.shape[0]:
        raise ValueError("need one SamplingParams and one generator per logits row")
    logits = logits.float()
    if any(banned):
        logits = logits.clone()
        for row, ids in enumerate(banned):
            logits[row, list(ids)] = float("-inf")
    tokens: list[int] = logits.argmax(dim=-1).tolist()
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return tokens
    probs = filtered_probs(logits[rows], [params[i] for i in rows])
    for row, i in enumerate(rows):
        generator = generators[i]
        if generator is None:
            raise ValueError(f"row {i} samples (temperature > 0) but has no generator")
        tokens[i] = int(torch.multinomial(probs[row], 1, generator=generator))
    return tokens


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    outputs: Sequence[Sequence[int]],
    prompts: Sequence[Sequence[int]] = (),
) -> torch.Tensor:
    """``logits`` with each row's penalties and biases applied, in vLLM's order: the
    repetition penalty over the tokens of its prompt (``prompts[i]``) and output so far
    (``outputs[i]``), the presence and frequency penalties over its output, then its
    logit bias. Unchanged when no row has any."""
    rows = [i for i, p in enumerate(params) if p.penalized]
    if not rows:
        return logits
    logits = logits.float().clone()
    device = logits.device
    for i in rows:
        p, output = params[i], outputs[i]
        if p.repetition_penalty != 1:
            seen = torch.tensor(
                sorted({*(prompts[i] if prompts else ()), *output}), dtype=torch.long, device=device
            )
            if len(seen):
                values = logits[i, seen]
                logits[i, seen] = torch.where(
                    values > 0, values / p.repetition_penalty, values * p.repetition_penalty
                )
        if output and (p.presence_penalty or p.frequency_penalty):
            ids, counts = torch.unique(torch.tensor(output, device=device), return_counts=True)
            logits[i, ids] -= p.presence_penalty + p.frequency_penalty * counts.to(logits.dtype)
        if p.logit_bias:
            ids = torch.tensor([t for t, _ in p.logit_bias], dtype=torch.long, device=device)
            bias = torch.tensor([b for _, b in p.logit_bias], device=device)
            logits[i, ids] += bias
    return logits


def filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Unnormalized probabilities after temperature, min-p, top-k and top-p (vLLM's
    order), row by row."""
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], device=device)
    vocab = logits.shape[-1]
    top_k = torch.tensor([p.top_k or vocab for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    scaled = logits / temperature[:, None]
    if any(p.min_p for p in params):
        min_p = torch.tensor([p.min_p for p in params], device=device)
        full = torch.softmax(scaled, dim=-1)
        floor = min_p[:, None] * full.max(dim=-1, keepdim=True).values
        scaled = scaled.masked_fill(full < floor, float("-inf"))
    ordered, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=device)
    ordered = ordered.masked_fill(rank[None, :] >= top_k[:, None], float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    # Keep a token while the mass before it is short of top_p: the first always stays.
    mass_before = torch.cumsum(probs, dim=-1) - probs
    probs = probs.masked_fill(mass_before >= top_p[:, None], 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, probs)
