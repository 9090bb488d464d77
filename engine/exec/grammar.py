"""Grammar-constrained sampling (``SamplingParams.grammar``, built by ``api.structured``):
one llguidance matcher per constrained request, whose token mask rules the logits of
its row before sampling and which then consumes the sampled token.

Each model's grammar tokenizer is built once, from its ``tokenizer.json`` and EOS ids,
when the executor takes the model up (up to a second for a large vocabulary: never on
the step path). The masks are computed on the host (llguidance
releases the GIL) into one int32 bitmask, 32 tokens a word, unpacked on the logits'
device; a token the mask does not allow gets -inf. A matcher that is stopped (its
grammar complete) ends the request (``StopChecker.append``'s ``grammar_done``).
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import torch


class GrammarTokenizers:
    """Each model's llguidance tokenizer, built once (``TorchExecutor.add_model``)."""

    def __init__(self) -> None:
        self._by_model: dict[str, llguidance.LLTokenizer] = {}

    def get(
        self, model: str, tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int]
    ) -> llguidance.LLTokenizer:
        tokenizer = self._by_model.get(model)
        if tokenizer is None:
            if not tokenizer_json:
                raise ValueError(f"model {model!r} has no tokenizer for constrained output")
            tokenizer = llguidance.LLTokenizer(
                tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids)
            )
            self._by_model[model] = tokenizer
        return tokenizer

    def forget(self, model: str) -> None:
        self._by_model.pop(model, None)


def new_matcher(tokenizer: llguidance.LLTokenizer, grammar: str) -> llguidance.LLMatcher:
    """A matcher at the start of ``grammar``; ValueError if the grammar is refused."""
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise ValueError(f"the output grammar cannot be used: {matcher.get_error()}")
    return matcher


def mask_logits(
    logits: torch.Tensor, rows: Sequence[tuple[int, llguidance.LLMatcher]]
) -> torch.Tensor:
    """``logits`` (``[num_rows, vocab]``; float32 when any row is limited) with each
    listed row limited to the tokens its matcher allows next; the other rows unchanged.
    Without rows, ``logits`` itself: no copy on a step without constrained requests."""
    if not rows:
        return logits
    vocab = logits.shape[-1]
    words = (vocab + 31) // 32
    bitmask = torch.full((len(rows), words), -1, dtype=torch.int32)
    for i, (_, matcher) in enumerate(rows):
        row = bitmask[i]
        matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
    shifts = torch.arange(32, dtype=torch.int32)
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(len(rows), words * 32)[:, :vocab]
    index = torch.tensor([row for row, _ in rows], device=logits.device)
    allowed = bits.to(logits.device).bool()
    logits = logits.to(torch.float32, copy=True)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return logits


def consume(matcher: llguidance.LLMatcher, token: int) -> bool:
    """Advance ``matcher`` by the sampled ``token``; whether its grammar is now done
    (complete, or broken, which no masked sample should cause)."""
    matcher.consume_token(token)
    return bool(matcher.is_stopped() or matcher.is_error())
