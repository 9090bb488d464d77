"""What a request's latency is and whether it met its SLO: one definition for the engine,
the simulator, the load generator and the control plane's usage records.

Times are in any one unit (seconds on one clock, or milliseconds). TTFT runs from
arrival to the first output token; TPOT is the mean gap between output tokens after the
first, so it needs two tokens. A request meets its TBT target when its TPOT is within it
(SuperInfer §5.1's metric), and trivially when it has no gaps (at most one token).
Pure logic.
"""

from __future__ import annotations


def ttft(arrival: float, first_token: float | None) -> float | None:
    """Seconds from arrival to the first token; None if no token came."""
    return None if first_token is None else first_token - arrival


def tpot(first_token: float | None, last_token: float | None, tokens: float) -> float | None:
    """(last - first) / (tokens - 1); None for one token or none. ``tokens`` may be a
    mean over several choices (the gateway sees their tokens together)."""
    if first_token is None or last_token is None or tokens <= 1:
        return None
    return (last_token - first_token) / (tokens - 1)


def ttft_met(*, success: bool, ttft_s: float | None, target_s: float) -> bool:
    """A failed request, or one without a first token, misses its TTFT target."""
    return success and ttft_s is not None and ttft_s <= target_s


def tbt_met(*, success: bool, tokens: int, tpot_s: float | None, target_s: float) -> bool | None:
    """A failed request misses its TBT target; one of at most one token has no gaps and
    meets it. One of more tokens whose TPOT is unknown (None: its token times were not
    seen) has an unknown outcome: None, which no count takes as met."""
    if not success:
        return False
    if tokens <= 1:
        return True
    return None if tpot_s is None else tpot_s <= target_s
