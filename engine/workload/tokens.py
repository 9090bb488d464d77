"""Tokens of text: counting them, with a model's tokenizer or estimated, and synthetic
prompts of a given length."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from shunter.engine.workload.requests import WorkloadError

TokenCounter = Callable[[str], int]
"""Counts the tokens of a text."""


def estimate_tokens(text: str) -> int:
    """About four characters per token for English text (OpenAI's tokenizer guidance)."""
    return max(1, round(len(text) / 4))


def token_counter(model_dir: str | Path) -> TokenCounter:
    """The token count of a text under the model's ``tokenizer.json`` (no special tokens)."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise WorkloadError(f"{model_dir}: no tokenizer.json in this model directory")
    tokenizer = Tokenizer.from_file(str(path))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


# Short, common English words: byte-pair tokenizers give about one token per word with
# its leading space, so a synthetic prompt of N words is about N tokens long.
_WORD_TEXT = (
    "the of and to in is it you that he was for on are as with his they at be this "
    "have from or one had by word but not what all were we when your can said there use "
    "an each which she do how their if will up other about out many then them these so "
    "some her would make like him into time has look two more write go see number no way "
    "could people my than first water been call who oil its now find long down day did get "
    "come made may part"
)
_WORDS = tuple(_WORD_TEXT.split())


def synthetic_prompt(num_words: int, rng: random.Random) -> str:
    """``num_words`` random common words: a prompt of about ``num_words`` tokens that no
    two requests share, so prefix caching cannot shorten it."""
    return " ".join(rng.choice(_WORDS) for _ in range(num_words))
