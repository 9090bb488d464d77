"""Incremental detokenization that never splits a UTF-8 character.

A byte-level BPE token is a run of bytes, and one character (an emoji, a CJK ideograph)
may span several tokens. Decoding token by token with ``errors="replace"`` would emit
U+FFFD for the first half and garbage for the second; instead the bytes go through an
incremental UTF-8 decoder that holds back an incomplete character until its last byte
arrives. Only genuinely invalid byte sequences become U+FFFD.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence

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


def token_bytes(tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> list[bytes]:
    """The bytes of every token id of a byte-level BPE tokenizer.

    Special tokens map to ``b""`` when skipped, else to their text; ids the tokenizer
    does not know (a model's vocabulary may be larger than its tokenizer's) map to
    ``b""`` as well. Raises ValueError for tokenizers that are not byte-level.
    """
    decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
    if decoder.get("type") != "ByteLevel":
        raise ValueError(
            f"incremental detokenization needs a ByteLevel decoder, got {decoder.get('type')!r}"
        )
    added = tokenizer.get_added_tokens_decoder()
    table: list[bytes] = []
    for token_id in range(tokenizer.get_vocab_size(with_added_tokens=True)):
        if token_id in added:
            token = added[token_id]
            skip = token.special and skip_special_tokens
            table.append(b"" if skip else token.content.encode())
            continue
        text = tokenizer.id_to_token(token_id)
        table.append(b"" if text is None else bytes(BYTE_OF_CHAR[c] for c in text))
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
