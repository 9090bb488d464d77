"""Incremental detokenization never splits a UTF-8 character."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models

from shunter.engine.exec.detok import BYTE_TOKEN, IncrementalDetokenizer, token_bytes

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


SENTENCEPIECE_TEXTS = [
    "The shunter moves cars to Zürich.\nIt sorts them by destination.",
    "Le train arrive à huit heures 🚂🚃\n\n列车进站了。 調度員 ✅",
    "mixed: café ß Ω ж 한국어 ❤️\tend\n",
]


def metaspace_decoder(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer`` with a Metaspace decoder after byte fallback instead of the
    Llama converter's Replace, Fuse and Strip."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")]
    )
    return copy


@pytest.mark.parametrize("text", SENTENCEPIECE_TEXTS)
@pytest.mark.parametrize("style", ["replace", "metaspace"])
def test_sentencepiece_tokens_stream_as_the_decode_continues(
    sentencepiece: Tokenizer, style: str, text: str
) -> None:
    """After any prefix of the tokens, the streamed text of the rest is what decoding the
    whole adds to decoding the prefix: spaces, newlines and byte-fallback characters
    included, and never a U+FFFD."""
    tokenizer = metaspace_decoder(sentencepiece) if style == "metaspace" else sentencepiece
    table = token_bytes(tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert any(BYTE_TOKEN.fullmatch(tokenizer.id_to_token(i) or "") for i in ids)
    whole = tokenizer.decode(ids)
    assert whole == text
    # Decoding drops the space the encoder put before the first word; a stream keeps it.
    assert "".join(stream(table, ids)) == " " + text
    splits = 0
    for k in range(1, len(ids)):
        head = tokenizer.decode(ids[:k])
        if "\ufffd" in head:  # k splits a byte-fallback character
            continue
        pieces = stream(table, ids[k:])
        assert "".join(pieces) == whole[len(head) :]
        assert not any("\ufffd" in p for p in pieces)
        splits += 1
    assert splits > len(ids) // 2


def test_byte_fallback_tokens_hold_back_partial_characters(sentencepiece: Tokenizer) -> None:
    ids = sentencepiece.encode("🚂\n", add_special_tokens=False).ids
    assert [sentencepiece.id_to_token(i) for i in ids] == [
        "▁",
        "<0xF0>",
        "<0x9F>",
        "<0x9A>",
        "<0x82>",
        "\n",
    ]
    assert stream(token_bytes(sentencepiece), ids) == [" ", "", "", "", "🚂", "\n", ""]


def test_sentencepiece_special_tokens_are_skipped_or_kept(sentencepiece: Tokenizer) -> None:
    assert token_bytes(sentencepiece)[:3] == [b"", b"", b""]
    assert token_bytes(sentencepiece, skip_special_tokens=False)[:3] == [b"<unk>", b"<s>", b"</s>"]


def test_without_a_byte_fallback_decoder_byte_tokens_are_text(sentencepiece: Tokenizer) -> None:
    copy = Tokenizer.from_str(sentencepiece.to_str())
    copy.decoder = decoders.Metaspace()
    table = token_bytes(copy)
    newline = copy.token_to_id("<0x0A>")
    assert table[newline] == b"<0x0A>"
    assert copy.decode([newline, newline]) == "<0x0A><0x0A>"


@pytest.mark.parametrize(
    "decoder",
    [
        decoders.WordPiece(),
        decoders.BPEDecoder(),
        decoders.Sequence([decoders.Replace("▁", " "), decoders.CTC()]),
        decoders.Sequence([decoders.Replace("_", " "), decoders.ByteFallback()]),
        decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()]),
        None,
    ],
    ids=["wordpiece", "bpe", "ctc", "other-replace", "no-space", "none"],
)
def test_other_tokenizers_are_refused_in_one_line(decoder: decoders.Decoder | None) -> None:
    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    if decoder is not None:
        tok.decoder = decoder
    with pytest.raises(ValueError, match=r"^unsupported tokenizer: decoder ") as error:
        token_bytes(tok)
    assert "\n" not in str(error.value)
