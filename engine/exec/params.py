"""Sampling parameters of one request. Pure data, no torch: the HTTP server builds them."""

from __future__ import annotations

from dataclasses import dataclass

MAX_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability and the ``top`` most likely tokens with theirs
    (id, log-probability), most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class SamplingParams:
    """How a request picks its tokens and when it stops (OpenAI / vLLM semantics).

    - ``temperature`` 0 is greedy; otherwise logits are divided by it, then ``top_k``
      (0: off) keeps the k most likely tokens and ``top_p`` (1: off) the smallest set
      whose probability reaches p.
    - ``seed`` makes the request's draws reproducible whatever else shares its batch;
      without one they are not.
    - The request ends after ``max_tokens`` tokens, or on a stop: EOS (unless
      ``ignore_eos``), a token of ``stop_token_ids``, or text containing a string of
      ``stop`` (the text ends before it). No stop counts before ``min_tokens`` tokens:
      until then EOS and the stop tokens cannot be sampled.
    - ``presence_penalty`` and ``frequency_penalty`` (OpenAI's, in [-2, 2]) lower the
      logits of tokens already in the output: by the first once a token appears, by the
      second for each time it appears.
    - ``logprobs`` (None: off) reports each sampled token's log-probability under the
      model's distribution, with that many most likely alternatives (0..20).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 keeps every token)")
        if self.max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError("min_tokens must be in [0, max_tokens]")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")
        if not (-2 <= self.presence_penalty <= 2 and -2 <= self.frequency_penalty <= 2):
            raise ValueError("presence_penalty and frequency_penalty must be in [-2, 2]")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0
