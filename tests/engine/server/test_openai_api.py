"""The SLO header: what ``slo_to_header`` writes, ``slo_from_header`` reads back."""

from __future__ import annotations

from shunter.engine.config import SloSpec
from shunter.engine.server.openai_api import slo_from_header, slo_to_header


def test_the_slo_header_reads_back_as_the_class_it_was_written_from() -> None:
    slo = SloSpec("interactive", ttft_s=1.0, tbt_s=0.05, alpha=2.5, beta_b=0.25, beta_f=0.75)
    other = SloSpec("other", ttft_s=9.0, tbt_s=0.9)
    header = slo_to_header(slo)
    assert header == "class=interactive,ttft_ms=1000,tbt_ms=50,alpha=2.5,beta_b=0.25,beta_f=0.75"
    # Every field is in it: the engine's own class of that name does not fill any in.
    assert slo_from_header(header, other, {"interactive": other}) == slo
