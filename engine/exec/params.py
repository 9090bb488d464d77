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
    - ``repetition_penalty`` (vLLM's; 1: off) divides the positive logits and multiplies
      the negative ones of every token already in the prompt or the output.
    - ``logit_bias`` adds a bias in [-100, 100] to the logits of the tokens it names
      (OpenAI's); ``min_p`` (vLLM's; 0: off) drops the tokens whose probability, after
      temperature, is below ``min_p`` times the most likely token's.
    - ``grammar`` (None: free text) is an llguidance grammar (``api.structured``) the
      output must follow: tokens it does not allow are never sampled, and the request
      ends when it is complete.
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
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: str | None = None

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
        if not self.repetition_penalty > 0:
            raise ValueError("repetition_penalty must be > 0 (1 is off)")
        if not 0 <= self.min_p <= 1:
            raise ValueError("min_p must be in [0, 1]")
        if any(not -100 <= bias <= 100 for _, bias in self.logit_bias):
            raise ValueError("logit_bias values must be in [-100, 100]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether the logits change before sampling: penalties or biases."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
            or bool(self.logit_bias)
        )
