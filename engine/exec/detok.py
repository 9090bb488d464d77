"""Incremental detokenization that never splits a UTF-8 character.

A token is a run of bytes, and one character (an emoji, a CJK ideograph) may span
several tokens. Decoding token by token with ``errors="replace"`` would emit U+FFFD for
the first half and garbage for the second; instead the bytes go through an incremental
UTF-8 decoder that holds back an incomplete character until its last byte arrives. Only
genuinely invalid byte sequences become U+FFFD, each maximal invalid part once (where the
``ByteFallback`` decoder of ``tokenizers`` replaces every byte of a failing run of byte
tokens).

Two kinds of tokenizer spell their tokens as bytes:

- byte-level BPE (Llama 3, Qwen2, GPT-2): every byte is one printable character;
- SentencePiece-style (Llama 2, Mistral): a token is text with ``▁`` for a space, and
  with byte fallback a byte the vocabulary lacks is a token ``<0xNN>``.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from tokenizers import Tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, used by every byte-level BPE."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


BYTE_OF_CHAR = {char: byte for byte, char in _bytes_to_unicode().items()}
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
"""A byte-fallback token, as the ``ByteFallback`` decoder reads it."""

Speller = Callable[[str], bytes]

_SENTENCEPIECE_DECODERS = {"Metaspace", "Replace", "ByteFallback", "Fuse", "Strip"}


def _byte_level(text: str) -> bytes:
    return bytes(BYTE_OF_CHAR[c] for c in text)


def _sentencepiece(space: str, byte_fallback: bool) -> Speller:
    def spell(text: str) -> bytes:
        byte = BYTE_TOKEN.fullmatch(text) if byte_fallback else None
        if byte is not None:
            return bytes([int(byte[1], 16)])
        return text.replace(space, " ").encode()

    return spell


def token_speller(tokenizer: Tokenizer) -> Speller:
    """How a token's text (``id_to_token``) of ``tokenizer`` becomes bytes.

    Reads the tokenizer's decoder: ``ByteLevel``; or SentencePiece-style ones, a
    ``Metaspace`` or a ``Replace`` of ``▁`` by a space, in a ``Sequence`` with
    ``ByteFallback``, ``Fuse`` and ``Strip``. Raises ValueError, with a one-line message,
    for any other decoder.

    The bytes of a token are those it adds after any earlier token: the space a
    SentencePiece decoder strips from the start of a whole text stays, since output
    tokens continue a prompt.
    """
    decoder: dict[str, Any] = json.loads(tokenizer.to_str()).get("decoder") or {}
    if decoder.get("type") == "ByteLevel":
        return _byte_level
    sequence = decoder.get("type") == "Sequence"
    parts: list[dict[str, Any]] = decoder.get("decoders", []) if sequence else [decoder]
    parts = [part for part in parts if part]  # no decoder at all: nothing to read
    kinds = [part.get("type") for part in parts]
    spaces = [part.get("replacement", "▁") for part in parts if part.get("type") == "Metaspace"]
    for part in parts:
        if part.get("type") == "Replace":
            if part.get("pattern") != {"String": "▁"} or part.get("content") != " ":
                spaces = []  # a replacement the table cannot make
                break
            spaces.append("▁")
    if len(set(spaces)) != 1 or not set(kinds) <= _SENTENCEPIECE_DECODERS:
        raise ValueError(
            f"unsupported tokenizer: decoder {kinds or None} is neither ByteLevel (byte-level "
            "BPE) nor SentencePiece-style (Metaspace or Replace ▁ by a space, ByteFallback)"
        )
    return _sentencepiece(spaces[0], byte_fallback="ByteFallback" in kinds)


def token_bytes(tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> list[bytes]:
    """The bytes of every token id of ``tokenizer`` (see ``token_speller``).

    Special tokens map to ``b""`` when skipped, else to their text; ids the tokenizer
    does not know (a model's vocabulary may be larger than its tokenizer's) map to
    ``b""`` as well. Raises ValueError for tokenizers ``token_speller`` refuses.
    """
    spell = token_speller(tokenizer)
    added = tokenizer.get_added_tokens_decoder()
    table: list[bytes] = []
    for token_id in range(tokenizer.get_vocab_size(with_added_tokens=True)):
        if token_id in added:
            token = added[token_id]
            skip = token.special and skip_special_tokens
            table.append(b"" if skip else token.content.encode())
            continue
        text = tokenizer.id_to_token(token_id)
        table.append(b"" if text is None else spell(text))
    return table


class IncrementalDetokenizer:
    """Turns a request's output tokens into text as they arrive.

    ``push(token_id)`` returns the text completed by that token, possibly ``""`` while a
    multi-byte character is unfinished; ``flush()`` returns what is left at the end
    (an unfinished character becomes U+FFFD). All pushes plus the flush equal decoding
    the whole sequence at once.
    """

    def __init__(self, table: Sequence[bytes]) -> None:
        self._table = table
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        data = self._table[token_id] if 0 <= token_id < len(self._table) else b""
        text: str = self._decoder.decode(data)
        return text

    def flush(self) -> str:
        text: str = self._decoder.decode(b"", final=True)
        return text
