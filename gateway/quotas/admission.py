"""A tenant's limits, the answer to one admission (with its refusal message and
``x-ratelimit-*`` headers), and the windows both limiters count in."""

from __future__ import annotations

import calendar
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shunter.tenants.models import Tenant

WINDOW_S = 60.0
CONCURRENCY_RETRY_S = 1.0


@dataclass(frozen=True)
class Limits:
    """A tenant's quotas; None is unlimited. ``budget_period`` is ``day`` or ``month``."""

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    token_budget: int | None = None
    budget_period: str = "day"

    def __post_init__(self) -> None:
        if self.budget_period not in ("day", "month"):
            raise ValueError(f"budget_period must be 'day' or 'month', not {self.budget_period!r}")

    @classmethod
    def of(cls, tenant: Tenant) -> Limits:
        return cls(
            rpm=tenant.rpm_limit,
            tpm=tenant.tpm_limit,
            concurrency=tenant.concurrency_limit,
            token_budget=tenant.token_budget,
            budget_period=tenant.budget_period,
        )

    @property
    def unlimited(self) -> bool:
        return (self.rpm, self.tpm, self.concurrency, self.token_budget) == (None,) * 4


@dataclass(frozen=True)
class Admission:
    """The answer to one check-and-increment. When admitted, the caller ends it with
    ``settle`` (which gives back ``lease`` when set and replaces the ``reserved`` tokens,
    counted in the windows of ``at``, by the tokens used; a refund also takes ``entry``,
    its place in the requests-per-minute window, back out). ``refused`` names the limit
    that refused it; ``too_large`` says the request could never be admitted under it.
    ``requests_used`` counts this request when admitted, ``tokens_used`` and
    ``budget_used`` its reservation; the ``*_reset_s`` fields are seconds until the
    window frees capacity."""

    admitted: bool
    limits: Limits
    refused: str | None = None
    too_large: bool = False
    sequences: int = 1
    reserved: int = 0
    at: float = 0.0
    lease: str | None = None
    entry: str | None = None
    retry_after_s: float = 0.0
    requests_used: int = 0
    requests_reset_s: float = 0.0
    tokens_used: int = 0
    tokens_reset_s: float = 0.0
    budget_used: int = 0

    def headers(self) -> dict[str, str]:
        """``Retry-After`` when refused, and the ``x-ratelimit-*`` headers of the limits
        that are set (OpenAI's names)."""
        out: dict[str, str] = {}
        if not self.admitted and not self.too_large:
            out["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
            out["retry-after-ms"] = str(max(1, math.ceil(1000 * self.retry_after_s)))
        rpm, tpm = self.limits.rpm, self.limits.tpm
        if rpm is not None:
            out["x-ratelimit-limit-requests"] = str(rpm)
            out["x-ratelimit-remaining-requests"] = str(max(0, rpm - self.requests_used))
            out["x-ratelimit-reset-requests"] = _duration(self.requests_reset_s)
        if tpm is not None:
            out["x-ratelimit-limit-tokens"] = str(tpm)
            out["x-ratelimit-remaining-tokens"] = str(max(0, tpm - self.tokens_used))
            out["x-ratelimit-reset-tokens"] = _duration(self.tokens_reset_s)
        return out

    @property
    def error_code(self) -> str:
        """OpenAI's error code of the refusal."""
        return "insufficient_quota" if self.refused == "budget" else "rate_limit_exceeded"

    def message(self) -> str:
        limits = self.limits
        if self.too_large:
            if self.refused == "concurrency":
                return (
                    f"This request runs {self.sequences} sequences at once, more than the "
                    f"concurrency limit of {limits.concurrency}: reduce the prompts or 'n'."
                )
            limit = (
                f"the token budget of {limits.token_budget} tokens per {limits.budget_period}"
                if self.refused == "budget"
                else f"the limit of {limits.tpm} tokens per minute"
            )
            return (
                f"This request may use up to {self.reserved} tokens (its prompt plus "
                f"max_tokens for each of its {self.sequences} sequences), more than {limit}: "
                "reduce max_tokens, 'n' or the prompt."
            )
        if self.refused == "budget":
            return (
                f"You exceeded your token budget of {limits.token_budget} tokens per "
                f"{limits.budget_period} ({self.budget_used} used, this request may use up "
                f"to {self.reserved})."
            )
        if self.refused == "concurrency":
            return (
                f"Too many concurrent requests: the limit is {limits.concurrency} sequences "
                f"and this request runs {self.sequences}."
            )
        if self.refused == "requests":
            return f"Rate limit reached: {limits.rpm} requests per minute."
        return (
            f"Rate limit reached: {limits.tpm} tokens per minute ({self.tokens_used} used, "
            f"this request may use up to {self.reserved})."
        )


def _duration(seconds: float) -> str:
    return f"{max(0.0, seconds):.3f}s"


def budget_period(now: float, period: str) -> tuple[str, float]:
    """The UTC period holding ``now``: its name (``20250131`` or ``202501``) and the
    seconds left until it ends."""
    day = datetime.fromtimestamp(now, UTC)
    if period == "day":
        start = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
        return day.strftime("%Y%m%d"), start + 86400 - now
    days = calendar.monthrange(day.year, day.month)[1]
    start = datetime(day.year, day.month, 1, tzinfo=UTC).timestamp()
    return day.strftime("%Y%m"), start + days * 86400 - now
