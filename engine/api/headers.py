"""The ``X-Shunter-*`` headers between the gateway and the engine, with their codecs.

The gateway tells the engine who sent a request (``TENANT_HEADER``) and its SLO class
(``SLO_HEADER``: ``slo_to_header`` writes it, ``slo_from_header`` reads it); the engine
answers with the prompt tokens it counted (``PROMPT_TOKENS_HEADER``), the request's
fields it ignored (``ignored_headers``: ``IGNORED_HEADER`` and a standard ``Warning``,
which the gateway passes on to the client) and, for a whole answer, its token times
(``timing.TIMING_HEADER``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence

from shunter.engine.api.errors import bad_request
from shunter.engine.config import DEFAULT_SLO, SloSpec

TENANT_HEADER = "X-Shunter-Tenant"
SLO_HEADER = "X-Shunter-Slo"
PROMPT_TOKENS_HEADER = "X-Shunter-Prompt-Tokens"
IGNORED_HEADER = "X-Shunter-Ignored-Parameters"
WARNING_HEADER = "Warning"
# A field name goes into a header as it is only if it is a plain identifier: anything
# else a client sent (spaces, newlines, non-ASCII) is counted, never echoed.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
MAX_IGNORED_NAMED = 16

SLO_FIELDS = {"ttft_ms": 1e-3, "tbt_ms": 1e-3, "alpha": 1.0, "beta_b": 1.0, "beta_f": 1.0}


def slo_to_header(slo: SloSpec) -> str:
    """``slo`` as ``X-Shunter-Slo`` spells it, every field, the floats in general form to
    12 digits (``0.5``, ``3``): ``slo_from_header`` reads it back as ``slo``."""
    return (
        f"class={slo.name},ttft_ms={1000 * slo.ttft_s:.12g},tbt_ms={1000 * slo.tbt_s:.12g},"
        f"alpha={slo.alpha:.12g},beta_b={slo.beta_b:.12g},beta_f={slo.beta_f:.12g}"
    )


def slo_from_header(
    value: str | None, default: SloSpec | None, classes: Mapping[str, SloSpec]
) -> SloSpec | None:
    """``X-Shunter-Slo: class=NAME,ttft_ms=N,tbt_ms=N,alpha=F,beta_b=F,beta_f=F`` (from
    the gateway). A ``class`` the engine knows (``classes``) is the starting point, else
    the model's ``default``; every field given then overrides it. 400 on a bad header."""
    if not value:
        return default
    fields: dict[str, str] = {}
    for part in value.replace(";", ",").split(","):
        key, sep, v = part.strip().partition("=")
        if not sep or (key != "class" and key not in SLO_FIELDS):
            raise bad_request(
                "X-Shunter-Slo: expected class=NAME,ttft_ms=N,tbt_ms=N,alpha=F,beta_b=F,"
                f"beta_f=F, got {value!r}."
            )
        fields[key] = v.strip()
    name = fields.pop("class", None)
    base = classes.get(name) if name is not None else None
    base = base or default or DEFAULT_SLO
    try:
        numbers = {key: float(v) * SLO_FIELDS[key] for key, v in fields.items()}
        if not all(math.isfinite(n) for n in numbers.values()):
            raise ValueError(f"values must be finite, got {value!r}")
        return dataclasses.replace(
            base,
            name=name or base.name,
            ttft_s=numbers.get("ttft_ms", base.ttft_s),
            tbt_s=numbers.get("tbt_ms", base.tbt_s),
            alpha=numbers.get("alpha", base.alpha),
            beta_b=numbers.get("beta_b", base.beta_b),
            beta_f=numbers.get("beta_f", base.beta_f),
        )
    except ValueError as e:
        raise bad_request(f"X-Shunter-Slo: {e}.") from None


def ignored_headers(names: Sequence[str]) -> dict[str, str]:
    """The headers that tell a client which of its fields were ignored (none: no
    headers): ``X-Shunter-Ignored-Parameters: a, b`` and ``Warning: 299 - "..."``
    (RFC 9110's miscellaneous persistent warning). At most ``MAX_IGNORED_NAMED`` plain
    names are listed; the rest are counted."""
    if not names:
        return {}
    plain = [n for n in names if _PLAIN_NAME.fullmatch(n)][:MAX_IGNORED_NAMED]
    listed = ", ".join(plain)
    more = len(names) - len(plain)
    if more:
        listed = f"{listed} (and {more} more)" if listed else f"{more} fields"
    return {
        IGNORED_HEADER: listed,
        WARNING_HEADER: f'299 - "Unknown parameters ignored: {listed}"',
    }
