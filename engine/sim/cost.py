"""Cost model: how long a forward step and a batch of host copies take on a profile.

Forward steps follow a per-layer roofline: each operator class takes the longer of its
compute time (FLOPs at the FLOP/s a GEMM achieves) and its memory time (bytes at the
bandwidth a memory-bound operator achieves): the profile's peaks scaled by its measured
efficiencies (``HardwareProfile.flops`` and ``bandwidth``). A layer has two such classes,
the weight GEMMs (read every weight once per step, FLOPs grow with tokens) and attention
(reads each sequence's KV, FLOPs grow with query x context), so a decode batch is
memory-bound and a long prefill compute-bound, as on real hardware. Activation traffic is
small next to weights and KV and is left out. A layer takes at least the profile's
``layer_overhead_s``, the host's time to issue its kernels: the host issues while the
device computes, so a layer costs the longer of the two, not their sum. The per-step
overhead (``step_overhead_s``) is the executor's, paid once a step.

Copies follow the profile's size-dependent link bandwidth, one launch per copy call, and,
when both directions run at once, a host-memory limit both directions share (full duplex).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shunter.engine.config import ModelSpec
from shunter.engine.sim.hardware import HardwareProfile


@dataclass(frozen=True)
class SeqWork:
    """One sequence's part of a step: ``num_new`` tokens computed on top of
    ``num_context`` tokens already in its KV cache (decode: ``num_new == 1``)."""

    num_new: int
    num_context: int


class StepCostModel:
    """Time of one forward step of ``model`` on ``hardware``."""

    def __init__(self, model: ModelSpec, hardware: HardwareProfile) -> None:
        self.model = model
        self.hardware = hardware
        m = model
        self._kv_layer = m.kv_bytes_per_token_layer
        # Causal attention: QK^T and PV are each 2 * heads * head_dim FLOPs per
        # (query, key) pair.
        self._attn_flops_per_pair = 4 * m.num_heads * m.head_dim
        norms = 2 * m.hidden_size
        self._linear_flops_per_token = 2 * (m.active_layer_params - norms)
        self._attn_weight_bytes = m.attention_params * m.dtype_bytes
        self._expert_bytes = m.expert_params * m.dtype_bytes
        self._head_bytes = m.vocab_size * m.hidden_size * m.dtype_bytes
        self._head_flops_per_seq = 2 * m.vocab_size * m.hidden_size

    def _experts_touched(self, num_tokens: int) -> float:
        """Expected distinct experts one layer reads for ``num_tokens`` tokens, with
        uniform routing (dense models: one MLP)."""
        m = self.model
        if not m.is_moe:
            return 1.0
        miss = (1.0 - m.num_active_experts / m.num_experts) ** num_tokens
        return m.num_experts * (1.0 - miss)

    def linear_time(self, num_tokens: int) -> float:
        """Weight GEMMs of one layer for ``num_tokens`` tokens."""
        hw = self.hardware
        flops = self._linear_flops_per_token * num_tokens
        weight_bytes = self._attn_weight_bytes + self._expert_bytes * self._experts_touched(
            num_tokens
        )
        return max(flops / hw.flops, weight_bytes / hw.bandwidth)

    def attention_time(self, work: Sequence[SeqWork]) -> float:
        """Attention of one layer over the batch: reads every sequence's KV once."""
        pairs = 0.0
        kv_tokens = 0
        for w in work:
            # Each new token attends to the context plus the new tokens before it.
            pairs += w.num_new * (w.num_context + (w.num_new + 1) / 2)
            kv_tokens += w.num_context + 2 * w.num_new  # read context + new, write new
        hw = self.hardware
        return max(
            pairs * self._attn_flops_per_pair / hw.flops,
            kv_tokens * self._kv_layer / hw.bandwidth,
        )

    def head_time(self, num_sampled: int) -> float:
        """Output projection for the sequences that sample a token this step."""
        if num_sampled == 0:
            return 0.0
        hw = self.hardware
        return max(
            num_sampled * self._head_flops_per_seq / hw.flops,
            self._head_bytes / hw.bandwidth,
        )

    def layer_time(self, work: Sequence[SeqWork]) -> float:
        """One decoder layer over ``work``: its roofline, or the host's time to issue
        its kernels where that is longer."""
        num_tokens = sum(w.num_new for w in work)
        roofline = self.linear_time(num_tokens) + self.attention_time(work)
        return max(roofline, self.hardware.layer_overhead_s)

    def forward_time(self, work: Sequence[SeqWork], num_sampled: int) -> float:
        """Seconds of this model's forward pass over ``work``, without the per-step
        overhead (a step that runs several models pays that once); zero without work."""
        if not any(w.num_new for w in work):
            return 0.0
        return self.model.num_layers * self.layer_time(work) + self.head_time(num_sampled)


@dataclass(frozen=True)
class CopyBatch:
    """Copies of one direction issued together, in ``num_calls`` copy calls (1 for a
    batched copy). ``groups`` are ``(num_segments, segment_bytes)`` pairs: a batch may
    hold blocks of several models, each a contiguous segment of its model's block size."""

    groups: tuple[tuple[int, int], ...] = ()
    num_calls: int = 1

    @property
    def total_bytes(self) -> int:
        return sum(n * size for n, size in self.groups)

    @property
    def is_empty(self) -> bool:
        return self.total_bytes == 0


class CopyCostModel:
    """Time of host<->device copy batches on ``hardware``.

    ``bandwidth_scale`` multiplies every bandwidth (link and host memory): 0.05 models a
    transfer engine that reaches ~5% of the link, like vLLM's on GH200 (SuperInfer §3.3).
    """

    def __init__(self, hardware: HardwareProfile, *, bandwidth_scale: float = 1.0) -> None:
        if bandwidth_scale <= 0:
            raise ValueError("bandwidth_scale must be positive")
        self.hardware = hardware
        self.bandwidth_scale = bandwidth_scale

    def segment_bandwidth(self, segment_bytes: int) -> float:
        """One direction alone: the link rate for this size, capped by host memory."""
        hw = self.hardware
        bw = hw.link_bandwidth(segment_bytes)
        if hw.host_mem_bw is not None:
            bw = min(bw, hw.host_mem_bw)
        return bw * self.bandwidth_scale

    def direction_bandwidth(self, batch: CopyBatch) -> float:
        """One direction alone: the batch's bytes over the time its segments take."""
        seconds = sum(n * size / self.segment_bandwidth(size) for n, size in batch.groups)
        return batch.total_bytes / seconds

    def one_way_time(self, batch: CopyBatch) -> float:
        """Seconds for ``batch`` with the other direction idle (0 when empty)."""
        if batch.is_empty:
            return 0.0
        launch = batch.num_calls * self.hardware.copy_launch_s
        return launch + batch.total_bytes / self.direction_bandwidth(batch)

    def duplex_times(self, d2h: CopyBatch, h2d: CopyBatch) -> tuple[float, float]:
        """Completion times ``(d2h_s, h2d_s)`` of two batches started together.

        While both run, each direction is capped by its one-way rate and together by the
        shared host-memory bandwidth, split max-min fairly; once one finishes, the other
        continues alone at its one-way rate. Each direction's launch cost comes first.
        """
        if d2h.is_empty or h2d.is_empty:
            return self.one_way_time(d2h), self.one_way_time(h2d)
        solo = (self.direction_bandwidth(d2h), self.direction_bandwidth(h2d))
        shared = self.hardware.host_mem_bw
        both = solo if shared is None else _max_min_share(solo, shared * self.bandwidth_scale)
        left = (float(d2h.total_bytes), float(h2d.total_bytes))
        done = 0 if left[0] / both[0] <= left[1] / both[1] else 1
        still = 1 - done
        t_done = left[done] / both[done]
        t_still = t_done + (left[still] - both[still] * t_done) / solo[still]
        times = [0.0, 0.0]
        times[done], times[still] = t_done, t_still
        launch = self.hardware.copy_launch_s
        return d2h.num_calls * launch + times[0], h2d.num_calls * launch + times[1]


def _max_min_share(caps: tuple[float, float], total: float) -> tuple[float, float]:
    """Max-min fair split of ``total`` between two flows capped at ``caps``."""
    low, high = (0, 1) if caps[0] <= caps[1] else (1, 0)
    rates = [0.0, 0.0]
    rates[low] = min(caps[low], total / 2)
    rates[high] = min(caps[high], total - rates[low])
    return rates[0], rates[1]
