"""Stops (EOS, stop tokens, stop strings, lengths) and the text a stream may show."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from shunter.engine.exec.detok import IncrementalDetokenizer, token_bytes
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.stop import LENGTH, STOP, StopChecker

EOS = 0


@pytest.fixture(scope="module")
def tokenizer(tiny_dirs: dict[str, Path]) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_dirs["tiny-llama"] / "tokenizer.json"))


class Feed:
    """Feeds token ids to a StopChecker, collecting what a stream would show."""

    def __init__(self, tokenizer: Tokenizer, **params: object) -> None:
        self.tokenizer = tokenizer
        detok = IncrementalDetokenizer(token_bytes(tokenizer))
        self.checker = StopChecker(SamplingParams(**params), {EOS}, detok)  # type: ignore[arg-type]
        self.shown: list[str] = []

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def feed(self, ids: list[int]) -> str | None:
        for token in ids:
            reason = self.checker.append(token)
            self.shown.append(self.checker.take_visible())
            if reason is not None:
                return reason
        return None


def test_eos_stops_and_adds_no_text(tokenizer: Tokenizer) -> None:
    f = Feed(tokenizer, max_tokens=50)
    assert f.feed([*f.ids("all done"), EOS, *f.ids("never")]) == STOP
    assert f.checker.text == "all done" == "".join(f.shown)


def test_ignore_eos_runs_to_max_tokens(tokenizer: Tokenizer) -> None:
    f = Feed(tokenizer, max_tokens=3, ignore_eos=True)
    assert f.feed([EOS, EOS, EOS]) == LENGTH
    assert f.checker.num_tokens == 3


def test_stop_token_ids_stop(tokenizer: Tokenizer) -> None:
    f = Feed(tokenizer, max_tokens=50, stop_token_ids=(42,))
    assert f.feed([*f.ids("ab"), 42]) == STOP
    assert f.checker.text == "ab"


def test_max_tokens_is_a_length_finish(tokenizer: Tokenizer) -> None:
    f = Feed(tokenizer, max_tokens=2)
    ids = f.ids("the train arrives at the station")
    assert f.feed(ids) == LENGTH
    assert f.checker.text == tokenizer.decode(ids[:2])


def test_min_tokens_bans_stops_until_reached(tokenizer: Tokenizer) -> None:
    f = Feed(tokenizer, max_tokens=10, min_tokens=2, stop_token_ids=(42,))
    assert f.checker.banned_tokens() == (EOS, 42)
    assert f.feed([EOS]) is None  # counted, but too early to stop
    assert f.checker.banned_tokens() == (EOS, 42)
    assert f.feed(f.ids("x")) is None
    assert f.checker.banned_tokens() == ()
    assert f.feed([EOS]) == STOP


def test_stop_string_cuts_the_text_even_across_tokens(tokenizer: Tokenizer) -> None:
    f = Feed(tokenizer, max_tokens=100, stop=("STOP here",))
    ids = [t for ch in "go on STOP here and more" for t in f.ids(ch)]  # one char per step
    assert f.feed(ids) == STOP
    assert f.checker.text == "go on "
    assert "".join(f.shown) == "go on "


def test_a_possible_stop_string_is_held_back_then_released(tokenizer: Tokenizer) -> None:
    f = Feed(tokenizer, max_tokens=100, stop=("<end>",))
    for ch, visible in [("a", "a"), ("<", ""), ("e", ""), ("x", "<ex"), ("<", "")]:
        assert f.feed(f.ids(ch)) is None
        assert f.shown[-1] == visible
    assert f.feed(f.ids("end>")) == STOP
    assert f.checker.text == "a<ex"


def test_earliest_of_several_stop_strings_wins(tokenizer: Tokenizer) -> None:
    f = Feed(tokenizer, max_tokens=100, stop=("cd", "b"))
    assert f.feed(f.ids("abcd")) == STOP
    assert f.checker.text == "a"


def test_stop_strings_before_min_tokens_do_not_count(tokenizer: Tokenizer) -> None:
    f = Feed(tokenizer, max_tokens=100, min_tokens=3, stop=("z",))
    assert f.feed([*f.ids("z"), *f.ids("y")]) is None
    assert f.feed(f.ids("z")) == STOP
    assert f.checker.text == "zy"


def test_multibyte_characters_survive_to_the_end(tokenizer: Tokenizer) -> None:
    f = Feed(tokenizer, max_tokens=100, stop=("。",))
    text = "列车🚂进站了。后面"
    assert f.feed(f.ids(text)) == STOP
    assert f.checker.text == "列车🚂进站了"
    assert "".join(f.shown) == "列车🚂进站了"


def test_appending_after_the_finish_is_an_error(tokenizer: Tokenizer) -> None:
    f = Feed(tokenizer, max_tokens=1)
    assert f.feed([5]) == LENGTH
    with pytest.raises(RuntimeError):
        f.checker.append(5)


def test_a_complete_grammar_ends_the_request_even_before_min_tokens(tokenizer: Tokenizer) -> None:
    f = Feed(tokenizer, max_tokens=50, min_tokens=10, ignore_eos=True)
    first, last = f.ids("ab")[:1], f.ids("}")
    assert f.feed(first) is None
    assert f.checker.append(last[0], grammar_done=True) == STOP
    assert f.checker.text == f.tokenizer.decode(first + last[:1])
    g = Feed(tokenizer, max_tokens=50, ignore_eos=True)
    g.feed(first)
    assert g.checker.append(EOS, grammar_done=True) == STOP  # EOS adds no text
    assert g.checker.text == g.tokenizer.decode(first)
