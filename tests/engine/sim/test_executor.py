import pytest

from shunter.engine.catalog import get_model
from shunter.engine.plan import BatchEntry, BlockCopies, BlockMove, LayerLoad, SlotStream, StepPlan
from shunter.engine.sim.clock import VirtualClock
from shunter.engine.sim.cost import CopyBatch, CopyCostModel, SeqWork, StepCostModel
from shunter.engine.sim.executor import SimulatedExecutor
from shunter.engine.sim.hardware import gh200
from shunter.engine.sim.transfers import SimulatedTransfers
from shunter.engine.sim.weights import WeightStreams

QWEN = get_model("qwen2.5-32b")
BLOCK = QWEN.block_bytes(16)


def make() -> tuple[VirtualClock, SimulatedTransfers, SimulatedExecutor]:
    clock = VirtualClock()
    transfers = SimulatedTransfers(clock, CopyCostModel(gh200), {QWEN.name: BLOCK})
    executor = SimulatedExecutor(
        clock,
        {QWEN.name: StepCostModel(QWEN, gh200)},
        transfers,
        block_bytes={QWEN.name: BLOCK},
        step_overhead_s=gh200.step_overhead_s,
        hbm_bw=gh200.hbm_bw,
    )
    return clock, transfers, executor


def decode(rid: str, context: int = 100) -> BatchEntry:
    return BatchEntry(rid, QWEN.name, 1, context, is_prefill=False, samples=True)


def copies(n: int, start: int = 0) -> BlockCopies:
    return BlockCopies(list(range(start, start + n)), list(range(start, start + n)))


def test_clock_never_goes_back() -> None:
    clock = VirtualClock()
    clock.advance_to(2.0)
    clock.advance_to(1.0)
    assert clock.now() == 2.0


def test_execute_advances_the_clock_by_the_modelled_step() -> None:
    clock, _, executor = make()
    prefill = BatchEntry("b", QWEN.name, 512, 0, is_prefill=True, samples=True)
    partial = BatchEntry("c", QWEN.name, 256, 0, is_prefill=True, samples=False)
    result = executor.execute(StepPlan(step=0, batch=[decode("a"), prefill, partial]))
    expected = gh200.step_overhead_s + StepCostModel(QWEN, gh200).forward_time(
        [SeqWork(1, 100), SeqWork(512, 0), SeqWork(256, 0)], 2
    )
    assert result.duration_s == pytest.approx(expected)
    assert clock.now() == pytest.approx(expected)
    assert result.emitted == {"a": None, "b": None}


def test_empty_step_takes_no_time_and_moves_cost_hbm_traffic() -> None:
    _, _, executor = make()
    assert executor.execute(StepPlan(step=0)).duration_s == 0.0
    plan = StepPlan(step=1, moves={QWEN.name: [BlockMove(1, 2), BlockMove(3, 4)]})
    expected = gh200.step_overhead_s + 2 * 2 * BLOCK / gh200.hbm_bw
    assert executor.execute(plan).duration_s == pytest.approx(expected)


def test_transfers_complete_in_duplex_time_and_are_polled_in_order() -> None:
    _, transfers, _ = make()
    plan = StepPlan(step=0, swap_out={QWEN.name: copies(100)}, swap_in={QWEN.name: copies(50)})
    transfers.submit(plan)
    d2h_s, h2d_s = CopyCostModel(gh200).duplex_times(
        CopyBatch(((100, BLOCK),)), CopyBatch(((50, BLOCK),))
    )
    h2d = transfers.pop_h2d_done(0)
    assert h2d is not None and transfers.link.landed(h2d) == pytest.approx(h2d_s)
    assert transfers.pop_h2d_done(0) is None
    assert transfers.poll(0.0) == []
    transfers.submit(StepPlan(step=1))  # no copies, but completes after step 0
    assert transfers.poll(0.0) == []
    assert transfers.poll(max(d2h_s, h2d_s)) == [0, 1]
    transfers.submit(StepPlan(step=2))  # nothing in flight: done at once
    assert transfers.poll(max(d2h_s, h2d_s)) == [2]
    assert transfers.totals.d2h_bytes == 100 * BLOCK
    assert transfers.totals.h2d_blocks == 50


def test_back_to_back_batches_queue_behind_each_other() -> None:
    _, transfers, _ = make()
    one = CopyCostModel(gh200).one_way_time(CopyBatch(((200, BLOCK),)))
    transfers.submit(StepPlan(step=0, rotate={QWEN.name: copies(200)}))
    transfers.submit(StepPlan(step=1, swap_in={QWEN.name: copies(200)}))
    h2d = transfers.pop_h2d_done(1)
    assert h2d is not None and transfers.link.landed(h2d) == pytest.approx(2 * one)
    assert transfers.poll(1.5 * one) == [0]
    assert transfers.poll(2 * one) == [1]


def test_swapped_in_request_waits_for_its_h2d_copy() -> None:
    clock, transfers, executor = make()
    plan0 = StepPlan(
        step=0, swapped_in=["r"], swap_in={QWEN.name: copies(2000)}, batch=[decode("a")]
    )
    transfers.submit(plan0)
    landed = CopyCostModel(gh200).one_way_time(CopyBatch(((2000, BLOCK),)))
    executor.execute(plan0)
    assert landed is not None and landed > clock.now()  # the copy outlasts the decode
    t_called = clock.now()
    result = executor.execute(StepPlan(step=1, batch=[decode("a"), decode("r")]))
    compute = gh200.step_overhead_s + StepCostModel(QWEN, gh200).forward_time(
        [SeqWork(1, 100), SeqWork(1, 100)], 2
    )
    assert clock.now() == pytest.approx(landed + compute)
    assert result.duration_s == pytest.approx(landed + compute - t_called)
    assert executor.totals.stall_s == pytest.approx(landed - t_called)


def test_streamed_layers_that_are_not_copied_in_time_stall_the_pass() -> None:
    clock = VirtualClock()
    transfers = SimulatedTransfers(clock, CopyCostModel(gh200), {QWEN.name: BLOCK})
    cost = StepCostModel(QWEN, gh200)
    t_layer = cost.forward_time([SeqWork(1, 100)], 1) / QWEN.num_layers
    # A layer copy takes 10 layers of compute: 32 layers through one slot cannot keep up.
    weights = WeightStreams({QWEN.name: 10 * t_layer}, {QWEN.name: QWEN.layer_bytes})
    executor = SimulatedExecutor(
        clock,
        {QWEN.name: cost},
        transfers,
        block_bytes={QWEN.name: BLOCK},
        step_overhead_s=gh200.step_overhead_s,
        hbm_bw=gh200.hbm_bw,
        weights=weights,
    )
    streamed = tuple(range(0, 64, 2))
    plan = StepPlan(
        step=0,
        batch=[decode("a")],
        streams={QWEN.name: SlotStream(streamed, (0,))},
        restored={QWEN.name: [LayerLoad(1, 1)]},
    )
    result = executor.execute(plan)
    compute = result.compute_s[QWEN.name]
    assert compute == pytest.approx(cost.forward_time([SeqWork(1, 100)], 1))
    assert executor.totals.weight_stall_s > 0 and executor.totals.num_weight_stalls > 0
    assert result.duration_s == pytest.approx(
        gh200.step_overhead_s + compute + executor.totals.weight_stall_s
    )
    # One restored layer, the 32 streamed ones, and the slot refilled for the next pass.
    assert executor.totals.weight_bytes == (1 + 32 + 1) * QWEN.layer_bytes
