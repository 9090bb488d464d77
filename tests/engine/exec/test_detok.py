"""Incremental detokenization never splits a UTF-8 character."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models

from shunter.engine.exec.detok import IncrementalDetokenizer, token_bytes

TEXTS = [
    "plain ascii text, numbers 1234 and punctuation!",
    "列车进站了。調度員看著信號燈。",
    "emoji 🚂🚃🚄 and a family 👨‍👩‍👧 with flags 🇫🇷🇯🇵",
    "mixed: café ÿ ß Ω ж 한국어 ❤️ end",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_dirs: dict[str, Path]) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_dirs["tiny-llama"] / "tokenizer.json"))


def stream(table: list[bytes], ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(table)
    return [detok.push(i) for i in ids] + [detok.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_the_whole_decode(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    pieces = stream(token_bytes(tokenizer), ids)
    assert "".join(pieces) == text == tokenizer.decode(ids)
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("text", TEXTS[1:])
def test_byte_by_byte_tokens_hold_back_partial_characters(tokenizer: Tokenizer, text: str) -> None:
    """Feeding single-byte tokens: each character appears whole, once its last byte is in."""
    table = token_bytes(tokenizer)
    byte_token = {t[0]: i for i, t in enumerate(table) if len(t) == 1}
    data = text.encode()
    pieces = stream(table, [byte_token[b] for b in data])
    assert "".join(pieces) == text
    emitted_at = [i for i, p in enumerate(pieces) if p]
    # Text is released exactly when a character completes: after its final byte.
    boundaries = [len(text[: k + 1].encode()) - 1 for k in range(len(text))]
    assert emitted_at == sorted(set(boundaries))


def test_an_unfinished_character_becomes_a_replacement_at_the_end(tokenizer: Tokenizer) -> None:
    table = token_bytes(tokenizer)
    byte_token = {t[0]: i for i, t in enumerate(table) if len(t) == 1}
    first_two = "🚂".encode()[:2]
    assert stream(table, [byte_token[b] for b in first_two]) == ["", "", "\ufffd"]


def test_special_tokens_are_skipped_or_kept(tokenizer: Tokenizer) -> None:
    eos = tokenizer.token_to_id("<|endoftext|>")
    assert token_bytes(tokenizer)[eos] == b""
    assert token_bytes(tokenizer, skip_special_tokens=False)[eos] == b"<|endoftext|>"


def test_ids_beyond_the_tokenizer_decode_to_nothing(tokenizer: Tokenizer) -> None:
    table = token_bytes(tokenizer)
    hello = tokenizer.encode("hi", add_special_tokens=False).ids
    assert "".join(stream(table, [len(table) + 5, *hello, 10**6])) == "hi"


def test_non_byte_level_tokenizers_are_refused() -> None:
    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.decoder = decoders.WordPiece()
    with pytest.raises(ValueError, match="ByteLevel"):
        token_bytes(tok)
