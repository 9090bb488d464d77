"""When a request's output ends, and which of its text a client may already see."""

from __future__ import annotations

from collections.abc import Collection

from shunter.engine.exec.detok import IncrementalDetokenizer
from shunter.engine.exec.params import SamplingParams

STOP = "stop"
LENGTH = "length"


class StopChecker:
    """Follows one request's output tokens: its text, its stops, its visible text.

    ``append(token_id)`` accounts a sampled token and returns the finish reason once the
    request ends: ``"stop"`` (EOS unless ignored, a stop token, a stop string) or
    ``"length"`` (``max_tokens``). A stop token's text is not part of the output; a stop
    string and everything after it is cut. Before ``min_tokens`` tokens nothing stops,
    and ``banned_tokens()`` names the tokens the sampler must not produce.

    ``take_visible()`` returns the text not shown before, holding back a tail that might
    still grow into a stop string, so a stream never shows text that is later cut.
    """

    def __init__(
        self,
        params: SamplingParams,
        eos_token_ids: Collection[int],
        detokenizer: IncrementalDetokenizer,
    ) -> None:
        self.params = params
        self._stop_ids = set(params.stop_token_ids)
        self._eos_ids = set(eos_token_ids)
        if not params.ignore_eos:
            self._stop_ids |= set(eos_token_ids)
        self._detok = detokenizer
        self._max_stop = max((len(s) for s in params.stop), default=0)
        self.text = ""
        self.num_tokens = 0
        self.finish_reason: str | None = None
        # The stop string or stop token id that ended it (None: EOS or the length).
        self.stop_reason: str | int | None = None
        self._shown = 0

    def banned_tokens(self) -> tuple[int, ...]:
        """Stop tokens while fewer than ``min_tokens`` tokens have been produced."""
        if self.num_tokens < self.params.min_tokens:
            return tuple(sorted(self._stop_ids))
        return ()

    def append(self, token_id: int, *, grammar_done: bool = False) -> str | None:
        """Account ``token_id``; ``grammar_done``: the request's grammar is complete with
        it, which ends the request (``"stop"``) whatever ``min_tokens`` says, without the
        text of an end-of-sequence token."""
        if self.finish_reason is not None:
            raise RuntimeError("the request has already finished")
        self.num_tokens += 1
        may_stop = self.num_tokens >= self.params.min_tokens
        if grammar_done:
            if token_id not in self._stop_ids and token_id not in self._eos_ids:
                self.text += self._detok.push(token_id)
            return self._finish(STOP, self._detok.flush())
        if may_stop and token_id in self._stop_ids:
            if token_id in self.params.stop_token_ids:
                self.stop_reason = token_id
            return self._finish(STOP, self._detok.flush())
        # A stop string may begin in text that arrived with earlier tokens.
        search_from = max(0, len(self.text) - self._max_stop + 1)
        self.text += self._detok.push(token_id)
        if may_stop and self.params.stop:
            found = [(i, s) for s in self.params.stop if (i := self.text.find(s, search_from)) >= 0]
            if found:
                at, self.stop_reason = min(found)
                self.text = self.text[:at]
                return self._finish(STOP, "")
        if self.num_tokens >= self.params.max_tokens:
            return self._finish(LENGTH, self._detok.flush())
        return None

    def _finish(self, reason: str, rest: str) -> str:
        self.text += rest
        self.finish_reason = reason
        return reason

    def take_visible(self) -> str:
        end = len(self.text)
        if self.finish_reason is None:
            end -= self._held_back()
        delta = self.text[self._shown : end]
        self._shown = max(self._shown, end)
        return delta

    def _held_back(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        for size in range(min(self._max_stop - 1, len(self.text)), 0, -1):
            tail = self.text[-size:]
            if any(s.startswith(tail) for s in self.params.stop):
                return size
        return 0
