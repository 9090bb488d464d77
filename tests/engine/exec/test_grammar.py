"""Grammar-constrained sampling on a real tokenizer: the mask leaves only the tokens the
grammar allows, a sampled path completes the grammar, and the stop rule ends it there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from shunter.engine.api.structured import json_grammar
from shunter.engine.exec.detok import IncrementalDetokenizer, token_bytes
from shunter.engine.exec.grammar import GrammarTokenizers, consume, mask_logits, new_matcher
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.stop import StopChecker

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}},
    "required": ["n", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(tiny_dirs: dict[str, Path]) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_dirs["tiny-qwen2"] / "tokenizer.json"))


def test_masked_sampling_writes_valid_json_and_stops(tokenizer: Tokenizer) -> None:
    vocab = tokenizer.get_vocab_size() + 7  # a model's rows may outnumber the tokenizer's
    eos = tokenizer.token_to_id("<|im_end|>")
    tokens = GrammarTokenizers().get("m", tokenizer.to_str(), vocab, [eos])
    grammar = json_grammar(SCHEMA, "response_format")
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        matcher = new_matcher(tokens, grammar)
        params = SamplingParams(max_tokens=100, grammar=grammar)
        stop = StopChecker(params, [eos], IncrementalDetokenizer(token_bytes(tokenizer)))
        while stop.finish_reason is None:
            logits = torch.randn(2, vocab, generator=generator)
            masked = mask_logits(logits, [(1, matcher)])
            assert torch.equal(masked[0], logits[0])  # an unconstrained row is untouched
            allowed = torch.isfinite(masked[1])
            assert 0 < int(allowed.sum()) < vocab and not allowed[-7:].any()
            token = int(torch.multinomial(torch.softmax(masked[1], -1), 1, generator=generator))
            stop.append(token, grammar_done=consume(matcher, token))
        assert stop.finish_reason == "stop" and stop.num_tokens < 100
        value = json.loads(stop.text)
        assert set(value) == {"n", "ok"} and 0 <= value["n"] <= 9


def test_a_grammar_without_a_tokenizer_is_an_error() -> None:
    with pytest.raises(ValueError, match="no tokenizer"):
        GrammarTokenizers().get("m", "", 10, [0])
