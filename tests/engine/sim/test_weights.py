"""Weight residency on the virtual clock: slots hide copies when the paper's inequalities
hold, a layer neither resident nor copied in time is a recorded stall, and weight copies
share the host-to-device link with KV swap-ins."""

from __future__ import annotations

import pytest

from shunter.engine.remap.layers import num_slots, select
from shunter.engine.sim.hardware import get_profile
from shunter.engine.sim.runner import simulate
from shunter.engine.sim.scenario_sweep import ScenarioSpec
from shunter.engine.sim.transfers import KV_STREAM, HostToDeviceLink
from shunter.engine.sim.weights import PassTiming, WeightStreams

N, T_C, HEAD = 40, 1e-3, 2e-4


def passes(t_transfer: float, alpha: int, count: int = 4) -> list[PassTiming]:
    """``count`` back-to-back passes of one model with ``alpha`` layers remapped."""
    layout = select(N, alpha, t_transfer, T_C)
    streams = WeightStreams({"m": t_transfer}, {"m": 1000})
    out, t = [], 0.0
    for _ in range(count):
        timing = streams.run_pass(
            "m",
            t,
            num_layers=N,
            t_layer=T_C,
            t_head=HEAD,
            streamed=layout.streamed,
            num_slots=layout.num_slots,
        )
        out.append(timing)
        t = timing.end
    return out


def test_resident_model_runs_at_compute_speed() -> None:
    timing = WeightStreams({"m": 1.0}, {"m": 1000}).run_pass(
        "m", 5.0, num_layers=N, t_layer=T_C, t_head=HEAD
    )
    assert timing == PassTiming(5.0 + N * T_C + HEAD, 0.0, 0, 0)


# (T_T / T_c, alpha, slots) with m = alpha + slots dividing the 40 layers evenly.
@pytest.mark.parametrize(
    ("ratio", "alpha", "slots"), [(1.0, 19, 1), (3.2, 7, 1), (3.8, 8, 2), (1.9, 18, 2)]
)
def test_feasible_layouts_stream_without_stalls_once_the_pipeline_runs(
    ratio: float, alpha: int, slots: int
) -> None:
    assert num_slots(N, alpha, ratio * T_C, T_C) == slots
    first, *steady = passes(ratio * T_C, alpha)
    assert first.stall_s > 0  # a cold start: slots begin empty
    for timing in steady:
        assert timing.stall_s == pytest.approx(0.0, abs=1e-12)
        assert timing.end - timing.stall_s > 0
    # m layers copied per pass: the slots' contents for the next pass are issued ahead.
    assert steady[-1].copied_bytes == 1000 * select(N, alpha, ratio * T_C, T_C).m


def test_uneven_gaps_stall_where_eq_4_holds_on_average() -> None:
    # m = 9 does not divide 40: gaps of 4 and 5 layers. Eq. 4 holds on average
    # (3.2 * 9 <= 31) but a copy after a 4-layer gap has 3 T_c to hide 3.2 T_c.
    assert num_slots(N, 8, 3.2 * T_C, T_C) == 1
    steady = passes(3.2 * T_C, 8)[-1]
    assert steady.num_stalls == 5
    assert steady.stall_s == pytest.approx(5 * 0.2 * T_C)


def test_a_layer_not_copied_in_time_is_a_recorded_stall() -> None:
    # T_T = 2.5 T_c with 16 layers through one slot: every copy outlasts the 1.5
    # layers of compute between slot uses.
    layout = select(N, 15, 0.0, T_C)  # forced: Eq. 4 would refuse it at this T_T
    streams = WeightStreams({"m": 2.5 * T_C}, {"m": 1000})
    t, timings = 0.0, []
    for _ in range(3):
        timing = streams.run_pass(
            "m", t, num_layers=N, t_layer=T_C, t_head=HEAD,
            streamed=layout.streamed, num_slots=layout.num_slots,
        )  # fmt: skip
        timings.append(timing)
        t = timing.end
    steady = timings[-1]
    assert steady.num_stalls >= layout.m - 1 and steady.stall_s > 0
    assert steady.end == pytest.approx(timings[-2].end + N * T_C + HEAD + steady.stall_s)


def test_restored_layers_wait_for_their_one_time_load() -> None:
    streams = WeightStreams({"m": 10 * T_C}, {"m": 1000})
    assert streams.load("m", [1, 0], 0.0) == 2000
    timing = streams.run_pass("m", 0.0, num_layers=N, t_layer=T_C, t_head=HEAD)
    # Layer 0 waits for its load (10 ms), layer 1 for the second load (another 10).
    assert timing.num_stalls == 2
    assert timing.stall_s == pytest.approx(10 * T_C + 9 * T_C)
    # Loaded once: the next pass runs at compute speed.
    again = streams.run_pass("m", timing.end, num_layers=N, t_layer=T_C, t_head=HEAD)
    assert again.stall_s == 0.0


def test_models_share_one_copy_stream() -> None:
    streams = WeightStreams({"a": 10 * T_C, "b": 10 * T_C}, {"a": 1, "b": 1})
    streams.load("a", [3], 0.0)
    streams.load("b", [0], 0.0)
    a = streams.run_pass("a", 0.0, num_layers=4, t_layer=T_C, t_head=0.0)
    b = streams.run_pass("b", 0.0, num_layers=4, t_layer=T_C, t_head=0.0)
    assert a.end == pytest.approx(10 * T_C + T_C)
    assert b.stall_s == pytest.approx(20 * T_C)  # queued behind a's load


def test_weight_copies_share_the_link_with_kv_swap_ins() -> None:
    link = HostToDeviceLink()
    swap_in = link.issue(KV_STREAM, 0.0, 2.0)  # a KV swap-in, 2 s on the link alone
    streams = WeightStreams({"m": 1.0}, {"m": 1000}, link=link)
    streams.load("m", [0], 0.5)  # a restored layer, issued while the swap-in runs
    timing = streams.run_pass("m", 0.0, num_layers=2, t_layer=0.1, t_head=0.0)
    # From 0.5 each moves at half the link: the layer's 1 s of copying lands at 2.5 (not
    # at 1.5 as alone, nor at 3 behind the whole swap-in), the swap-in at 3.
    assert timing.stall_s == pytest.approx(2.5)
    assert timing.copy_s is None  # a restored layer's load is not a slot copy
    assert link.landed(swap_in) == pytest.approx(3.0) and link.busy_s == pytest.approx(3.0)


def test_a_pass_reports_how_long_its_slot_copies_took_on_a_shared_link() -> None:
    link = HostToDeviceLink()
    link.issue(KV_STREAM, 0.0, 2.0)
    streams = WeightStreams({"m": 1.0}, {"m": 1000}, link=link)
    timing = streams.run_pass(
        "m", 0.5, num_layers=2, t_layer=0.1, t_head=0.0, streamed=(0,), num_slots=1
    )
    # Its one slot copy, issued at 0.5 beside the swap-in, took 2 s for 1 s of copying:
    # what the remapper's T_T then follows.
    assert timing.copy_s == pytest.approx(2.0) and timing.stall_s == pytest.approx(2.0)


def test_a_combined_run_never_moves_more_than_the_link_carries() -> None:
    # c1 spatial with remapping and rotation: weight streaming and KV swap-ins at once.
    spec = ScenarioSpec("c1", ("spatial",), ("combined",), (16.0,), duration_s=20.0)
    run = simulate(spec.sim_config("combined", "spatial"), spec.workload("spatial", 16.0))
    link_bw = max(bandwidth for _, bandwidth in get_profile(spec.hardware_name).copy_curve)
    assert run.weight_bytes > 0 and run.h2d_bytes > 0
    assert (run.weight_bytes + run.h2d_bytes) / run.sim_duration_s <= link_bw
