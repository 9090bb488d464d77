"""``X-Shunter-Slo``: a known class is the starting point, every field given overrides it;
what ``slo_to_header`` writes, ``slo_from_header`` reads back."""

from __future__ import annotations

import pytest

from shunter.engine.api.errors import ApiError
from shunter.engine.api.headers import (
    IGNORED_HEADER,
    WARNING_HEADER,
    ignored_headers,
    slo_from_header,
    slo_to_header,
)
from shunter.engine.config import DEFAULT_SLO, SloSpec

GOLD = SloSpec("gold", ttft_s=1.0, tbt_s=0.05, alpha=5.0, beta_b=0.2, beta_f=0.3)
MODEL = SloSpec("model-default", ttft_s=4.0, tbt_s=0.2, alpha=2.0, beta_b=0.0, beta_f=0.5)
CLASSES = {"gold": GOLD}


def test_no_header_keeps_the_models_class() -> None:
    assert slo_from_header(None, MODEL, CLASSES) is MODEL
    assert slo_from_header("", None, CLASSES) is None


def test_a_known_class_starts_from_its_weights() -> None:
    assert slo_from_header("class=gold", MODEL, CLASSES) == GOLD
    slo = slo_from_header("class=gold,ttft_ms=800", MODEL, CLASSES)
    assert slo == SloSpec("gold", ttft_s=0.8, tbt_s=0.05, alpha=5.0, beta_b=0.2, beta_f=0.3)


def test_an_unknown_class_starts_from_the_models_default() -> None:
    slo = slo_from_header("class=bronze,tbt_ms=150", MODEL, CLASSES)
    assert slo == SloSpec("bronze", ttft_s=4.0, tbt_s=0.15, alpha=2.0, beta_b=0.0, beta_f=0.5)
    assert slo_from_header("tbt_ms=150", None, CLASSES) == SloSpec(
        DEFAULT_SLO.name, ttft_s=DEFAULT_SLO.ttft_s, tbt_s=0.15
    )


def test_every_vlt_weight_given_is_applied() -> None:
    header = "class=gold,ttft_ms=2000,tbt_ms=100,alpha=1.5,beta_b=0.25,beta_f=0.75"
    slo = slo_from_header(header, MODEL, CLASSES)
    assert slo == SloSpec("gold", ttft_s=2.0, tbt_s=0.1, alpha=1.5, beta_b=0.25, beta_f=0.75)


@pytest.mark.parametrize(
    "header",
    ["bogus", "ttft_ms=fast", "tbt_ms=-5", "alpha=-1", "beta_f=x", "beta_b=nan", "gamma=1"],
)
def test_bad_values_are_a_400(header: str) -> None:
    with pytest.raises(ApiError) as e:
        slo_from_header(header, MODEL, CLASSES)
    assert e.value.status == 400 and "X-Shunter-Slo" in e.value.body()["error"]["message"]


def test_the_slo_header_reads_back_as_the_class_it_was_written_from() -> None:
    slo = SloSpec("interactive", ttft_s=1.0, tbt_s=0.05, alpha=2.5, beta_b=0.25, beta_f=0.75)
    other = SloSpec("other", ttft_s=9.0, tbt_s=0.9)
    header = slo_to_header(slo)
    assert header == "class=interactive,ttft_ms=1000,tbt_ms=50,alpha=2.5,beta_b=0.25,beta_f=0.75"
    # Every field is in it: the engine's own class of that name does not fill any in.
    assert slo_from_header(header, other, {"interactive": other}) == slo


def test_ignored_fields_are_named_plainly_and_never_echoed_raw() -> None:
    assert ignored_headers(()) == {}
    headers = ignored_headers(("misspelt", "top_n"))
    assert headers[IGNORED_HEADER] == "misspelt, top_n"
    assert headers[WARNING_HEADER] == '299 - "Unknown parameters ignored: misspelt, top_n"'
    hostile = ignored_headers(("ok", "bad\r\nSet-Cookie: x=1", "é", "x" * 65))
    assert hostile[IGNORED_HEADER] == "ok (and 3 more)"
    assert ignored_headers(("a b",))[IGNORED_HEADER] == "1 fields"
    many = ignored_headers(tuple(f"f{i:02}" for i in range(20)))
    assert many[IGNORED_HEADER].endswith("f15 (and 4 more)")
    for value in (*hostile.values(), *many.values()):
        value.encode("ascii")  # a header value, one line
        assert "\n" not in value and "\r" not in value
