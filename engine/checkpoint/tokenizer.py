"""A byte-level BPE tokenizer trained locally on a small built-in corpus.

Byte-level means every byte has a token, so any text (CJK, emoji) round-trips, as with
the Llama 3 and Qwen2 tokenizers; the corpus only decides which merges exist. Training
is deterministic and takes well under a second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from shunter.engine.api.chatml import CHATML_TEMPLATE

BOS = "<|begin_of_text|>"
EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOS, BOS, IM_START, IM_END)

CHAT_TEMPLATE = CHATML_TEMPLATE  # api.chatml

# Merges beyond this add nothing on a corpus this small.
MAX_TRAINED_VOCAB = 2048

CORPUS = """\
A shunter is a small locomotive that moves railway cars between the tracks of a yard.
It takes a train apart, sorts the cars by destination, and builds new trains from them.
The yard has a hump, a ladder of switches, and many parallel tracks called classification
tracks. Each car rolls down the hump and the switches send it to its track.
Freight cars carry coal, grain, timber, steel, containers and chemicals. Passenger cars
carry people from one city to the next; the timetable says when each train departs.
The dispatcher watches every signal and every block of track, and no two trains may
occupy one block at the same time. When the line is busy, a slow train waits in a siding
so that a fast one can pass. Every minute of delay is written down in the log.

Memory on a graphics card is fast but small; memory on the host is large but slower.
A serving engine keeps the key and value cache of each request in blocks of sixteen tokens.
When the card runs out of blocks, some requests rotate to the host and come back later.
The scheduler decides who runs, who waits and who rotates, one step at a time, so that
the time to the first token and the time between tokens stay within their targets.
Parameters of models that are not running can lend their memory to the cache for a while.

def schedule(requests, free_blocks):
    running = [r for r in requests if r.state == "running"]
    for request in sorted(requests, key=lambda r: r.lag, reverse=True):
        if request.blocks <= free_blocks:
            free_blocks -= request.blocks
            running.append(request)
    return running

for i in range(10):
    print(i, i * i, 2 ** i, "step", {"id": i, "tokens": [1, 2, 3]})

Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048 4096 8192 3.14 2.718 1e-5
Dates and times: 2024-03-15 09:30:00, 12:45, Monday, Tuesday, Wednesday, Thursday, Friday.
Le train de marchandises arrive en gare à huit heures. Der Zug fährt um neun Uhr ab.
El tren sale de la estación a las diez. Il treno è in ritardo di cinque minuti.
列车进站了。调度员看着信号灯。每一节车厢都有自己的目的地。
電車が駅に着きました。次の列車は十時に出発します。
기차가 역에 도착했습니다. Поезд прибывает на станцию в полдень.
Emoji: 🚂 🚃 🚄 🚆 🚉 ✅ ❤️ 👍 🎉 😀 🙂 🤖 🌍 ⭐
"""


@dataclass(frozen=True)
class TokenizerFiles:
    """The special tokens' ids in a written tokenizer (``bos_id`` None when unused)."""

    vocab_size: int
    bos_id: int | None
    eos_ids: tuple[int, ...]


def train_tokenizer(max_vocab: int, *, add_bos: bool) -> Tokenizer:
    """Train a byte-level BPE tokenizer of at most ``max_vocab`` tokens on CORPUS.

    With ``add_bos`` encoding a text prepends BOS, as the Llama and Mistral tokenizers
    do (Qwen2's does not).
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if max_vocab < len(alphabet) + len(SPECIAL_TOKENS):
        raise ValueError(
            f"a byte-level tokenizer needs a vocabulary of at least "
            f"{len(alphabet) + len(SPECIAL_TOKENS)} tokens, got {max_vocab}"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(max_vocab, MAX_TRAINED_VOCAB),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    if add_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A",
            pair=f"{BOS} $A {BOS} $B",
            special_tokens=[(BOS, tokenizer.token_to_id(BOS))],
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def write_tokenizer(
    out: Path, *, max_vocab: int, add_bos: bool, model_max_length: int
) -> TokenizerFiles:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (with a chat template)."""
    tokenizer = train_tokenizer(max_vocab, add_bos=add_bos)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS if add_bos else None,
        "eos_token": EOS,
        "pad_token": EOS,
        "add_bos_token": add_bos,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    def token_id(token: str) -> int:
        found = tokenizer.token_to_id(token)
        assert found is not None, token
        return found

    return TokenizerFiles(
        vocab_size=tokenizer.get_vocab_size(),
        bos_id=token_id(BOS) if add_bos else None,
        eos_ids=(token_id(EOS), token_id(IM_END)),
    )
