"""``X-Shunter-Timing``: how the tokens of a non-streamed response came out of the engine.

A non-streamed response shows every token at once, so a proxy in front (the gateway)
cannot see the gaps between them. The engine can: it answers with
``X-Shunter-Timing: ttft_ms=F,tpot_ms=F,max_itl_ms=F,e2e_ms=F``, on its clock from the
request's arrival (ARCHITECTURE.md's definitions: TPOT excludes the first token).
``e2e_ms`` runs to when the response was built, so ``e2e_ms - ttft_ms`` is how long the
answer was held after its first token. With several choices each field is the worst
(largest) over them; ``tpot_ms`` and ``max_itl_ms`` are left out when no choice has two
tokens (no gap to time).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from shunter.engine.request import Request

TIMING_HEADER = "X-Shunter-Timing"


@dataclass(frozen=True)
class EngineTiming:
    """One response's timing in milliseconds (see the module docstring)."""

    ttft_ms: float
    e2e_ms: float
    tpot_ms: float | None = None
    max_itl_ms: float | None = None

    def header(self) -> str:
        fields = {
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "max_itl_ms": self.max_itl_ms,
            "e2e_ms": self.e2e_ms,
        }
        return ",".join(f"{key}={value:.3f}" for key, value in fields.items() if value is not None)

    @classmethod
    def parse(cls, value: str | None) -> EngineTiming | None:
        """The timing a header gives; None without one, or for one that is not a
        well-formed header with non-negative ``ttft_ms`` <= ``e2e_ms``."""
        if not value:
            return None
        numbers: dict[str, float] = {}
        for part in value.split(","):
            key, _, text = part.strip().partition("=")
            try:
                number = float(text)
            except ValueError:
                return None
            if not math.isfinite(number) or number < 0:
                return None
            numbers[key] = number
        ttft, e2e = numbers.get("ttft_ms"), numbers.get("e2e_ms")
        if ttft is None or e2e is None or ttft > e2e:
            return None
        return cls(ttft, e2e, numbers.get("tpot_ms"), numbers.get("max_itl_ms"))


def response_timing(requests: Sequence[Request], now: float) -> EngineTiming | None:
    """The timing of a response whose choices are ``requests`` (finished), built at
    ``now`` on the engine's clock; None if no choice has a token."""
    ttfts = [ttft for r in requests if (ttft := r.ttft) is not None]
    if not ttfts:
        return None
    tpots = [tpot for r in requests if (tpot := r.tpot) is not None]
    itls = [
        max(b - a for a, b in itertools.pairwise(r.token_times))
        for r in requests
        if len(r.token_times) > 1
    ]
    return EngineTiming(
        ttft_ms=1000 * max(ttfts),
        e2e_ms=1000 * (now - min(r.t_arr for r in requests)),
        tpot_ms=1000 * max(tpots) if tpots else None,
        max_itl_ms=1000 * max(itls) if itls else None,
    )
