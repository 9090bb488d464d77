import dataclasses

import pytest

from shunter.engine.catalog import get_model
from shunter.engine.sim.cost import CopyBatch, CopyCostModel, SeqWork, StepCostModel
from shunter.engine.sim.hardware import GB, MiB, gh200, h100, h200

QWEN = get_model("qwen2.5-32b")
# The roofline alone: no per-layer host floor.
ROOFLINE = dataclasses.replace(gh200, layer_overhead_s=0.0)


def fwd(cost: StepCostModel, work: list[SeqWork], num_sampled: int) -> float:
    return cost.forward_time(work, num_sampled)


def decodes(n: int, context: int) -> list[SeqWork]:
    return [SeqWork(1, context) for _ in range(n)]


def test_decode_is_memory_bound_at_the_achieved_bandwidth() -> None:
    cost = StepCostModel(QWEN, ROOFLINE)
    # A decode step reads every layer and the output head (not the input embedding), at
    # the bandwidth a memory-bound operator achieves, not the datasheet's.
    head_bytes = QWEN.vocab_size * QWEN.hidden_size * QWEN.dtype_bytes
    weights_s = (QWEN.num_layers * QWEN.layer_bytes + head_bytes) / gh200.bandwidth
    assert gh200.bandwidth == pytest.approx(gh200.hbm_bw * gh200.hbm_efficiency)
    one = fwd(cost, decodes(1, 512), 1)
    # Reading the weights dominates; one sequence's KV adds a little.
    assert weights_s < one < 1.05 * weights_s
    # 32 decodes cost barely more than one: the weight read is shared.
    assert fwd(cost, decodes(32, 512), 32) < 1.2 * one
    linear_flops_s = 2 * QWEN.num_params * 32 / gh200.flops
    assert linear_flops_s < QWEN.param_bytes / gh200.bandwidth


def test_long_prefill_is_compute_bound_at_the_achieved_flops() -> None:
    cost = StepCostModel(QWEN, gh200)
    t4k = fwd(cost, [SeqWork(4096, 0)], 1)
    flops_s = 2 * QWEN.num_layers * QWEN.layer_params * 4096 / gh200.flops
    assert flops_s < t4k < 1.3 * flops_s
    # Twice the tokens, at least twice the time (attention grows quadratically).
    assert fwd(cost, [SeqWork(8192, 0)], 1) > 2 * t4k


def test_halving_an_efficiency_doubles_the_time_it_bounds() -> None:
    slow_hbm = dataclasses.replace(ROOFLINE, hbm_efficiency=ROOFLINE.hbm_efficiency / 2)
    slow_gemm = dataclasses.replace(ROOFLINE, gemm_efficiency=ROOFLINE.gemm_efficiency / 2)
    decode, prefill = decodes(64, 1024), [SeqWork(4096, 0)]
    fast = StepCostModel(QWEN, ROOFLINE)
    # A decode layer is memory-bound: only the HBM fraction moves it.
    assert StepCostModel(QWEN, slow_hbm).layer_time(decode) == pytest.approx(
        2 * fast.layer_time(decode)
    )
    assert StepCostModel(QWEN, slow_gemm).layer_time(decode) == pytest.approx(
        fast.layer_time(decode)
    )
    # A long prefill layer is compute-bound: only the GEMM fraction moves it.
    assert StepCostModel(QWEN, slow_gemm).layer_time(prefill) == pytest.approx(
        2 * fast.layer_time(prefill)
    )
    assert StepCostModel(QWEN, slow_hbm).layer_time(prefill) == pytest.approx(
        fast.layer_time(prefill)
    )


def test_a_layer_takes_the_longer_of_its_roofline_and_the_host_floor() -> None:
    llama = get_model("llama-3-8b")
    floor = 1e-3  # above any roofline layer below
    floored = StepCostModel(llama, dataclasses.replace(h100, layer_overhead_s=floor))
    bare = StepCostModel(llama, dataclasses.replace(h100, layer_overhead_s=0.0))
    small = decodes(1, 128)
    assert bare.layer_time(small) < floor
    assert floored.layer_time(small) == floor
    assert floored.forward_time(small, 1) == pytest.approx(
        llama.num_layers * floor + floored.head_time(1)
    )
    # Longer than the floor, the roofline stands alone: overlapped, not added.
    big = [SeqWork(8192, 0)]
    assert bare.layer_time(big) > floor
    assert floored.layer_time(big) == bare.layer_time(big)


def test_step_time_grows_with_batch_and_context() -> None:
    cost = StepCostModel(QWEN, gh200)
    by_batch = [fwd(cost, decodes(n, 1024), n) for n in (1, 8, 64, 256, 1024)]
    assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1]
    by_context = [fwd(cost, decodes(64, c), 64) for c in (16, 256, 2048, 16384)]
    assert by_context == sorted(by_context) and by_context[0] < by_context[-1]
    by_chunk = [fwd(cost, [SeqWork(q, 0)], 1) for q in (16, 256, 1024, 4096)]
    assert by_chunk == sorted(by_chunk)


def test_empty_step_costs_nothing() -> None:
    assert StepCostModel(QWEN, gh200).forward_time([], 0) == 0.0


def test_moe_decode_reads_only_the_routed_experts() -> None:
    mixtral = get_model("mixtral-8x7b")
    cost = StepCostModel(mixtral, gh200)
    one = cost.linear_time(1)
    many = cost.linear_time(256)
    expert_s = mixtral.expert_params * mixtral.dtype_bytes / gh200.bandwidth
    attn_s = mixtral.attention_params * mixtral.dtype_bytes / gh200.bandwidth
    assert one == pytest.approx(attn_s + 2 * expert_s)
    # 256 tokens routed two-of-eight touch every expert.
    assert many == pytest.approx(attn_s + 8 * expert_s, rel=1e-3)


def test_copy_time_follows_segment_size() -> None:
    copies = CopyCostModel(gh200)
    total = 1 << 30
    small = copies.one_way_time(CopyBatch(((total // (64 * 1024), 64 * 1024),)))
    large = copies.one_way_time(CopyBatch(((total // (8 * MiB), 8 * MiB),)))
    assert small > 10 * large
    assert large == pytest.approx(gh200.copy_launch_s + total / (200 * GB))
    # One call per segment pays a launch each.
    unbatched = copies.one_way_time(CopyBatch(((128, 8 * MiB),), num_calls=128))
    assert unbatched == pytest.approx(large + 127 * gh200.copy_launch_s)


def test_gh200_duplex_is_limited_by_shared_grace_dram() -> None:
    copies = CopyCostModel(gh200)
    batch = CopyBatch(((1000, 8_000_000),))  # 8 GB each way (SuperInfer Table 1)
    d2h, h2d = copies.duplex_times(batch, batch)
    # Ideal duplex: 192 GB/s per direction, 41.66 ms for 8 GB each way.
    assert d2h == pytest.approx(0.04166, rel=0.01)
    assert h2d == pytest.approx(d2h)
    alone = copies.one_way_time(batch)
    assert alone < d2h < 2 * alone


def test_duplex_survivor_speeds_up_after_the_other_finishes() -> None:
    copies = CopyCostModel(gh200)
    big, small = CopyBatch(((1000, 8 * MiB),)), CopyBatch(((100, 8 * MiB),))
    d2h, h2d = copies.duplex_times(big, small)
    assert h2d < d2h
    shared_rate = 192 * GB
    both_s = small.total_bytes / shared_rate
    expected = both_s + (big.total_bytes - shared_rate * both_s) / (200 * GB)
    assert d2h == pytest.approx(gh200.copy_launch_s + expected)


def test_pcie_directions_are_independent() -> None:
    copies = CopyCostModel(h200)
    batch = CopyBatch(((100, 8 * MiB),))
    assert copies.duplex_times(batch, batch) == pytest.approx(
        (copies.one_way_time(batch), copies.one_way_time(batch))
    )
    assert copies.one_way_time(batch) > CopyCostModel(gh200).one_way_time(batch) * 3


def test_bandwidth_scale_slows_every_copy() -> None:
    fast, slow = CopyCostModel(gh200), CopyCostModel(gh200, bandwidth_scale=0.05)
    batch = CopyBatch(((500, 4 * MiB),))
    launch = gh200.copy_launch_s
    assert slow.one_way_time(batch) - launch == pytest.approx(
        20 * (fast.one_way_time(batch) - launch)
    )
    fast_d, _ = fast.duplex_times(batch, batch)
    slow_d, _ = slow.duplex_times(batch, batch)
    assert slow_d - launch == pytest.approx(20 * (fast_d - launch))
    with pytest.raises(ValueError):
        CopyCostModel(gh200, bandwidth_scale=0)


def test_mixed_batch_takes_the_sum_of_its_segments_times() -> None:
    copies = CopyCostModel(gh200)
    small, large = (1000, 64 * 1024), (10, 8 * MiB)
    mixed = copies.one_way_time(CopyBatch((small, large)))
    parts = copies.one_way_time(CopyBatch((small,))) + copies.one_way_time(CopyBatch((large,)))
    assert mixed == pytest.approx(parts - gh200.copy_launch_s)
    assert copies.one_way_time(CopyBatch()) == 0.0
