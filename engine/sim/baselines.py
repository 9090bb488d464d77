"""Baselines named after the systems they stand for, as the papers ran them.

A baseline is a scheduling policy with the engine settings of the system it names:
how a preempted request's KV is handled, whether blocks rotate to host ahead of
preemption, and the engine's limits (running requests, tokens per step, B_xfer). A
simulated run may still override a limit (``--max-running``, ``--max-batch-tokens``,
``--xfer-budget``); what is not given comes from the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

from shunter.engine.config import RotationConfig, SchedulerConfig


@dataclass(frozen=True)
class Baseline:
    """``policy`` and ``preemption`` as in ``SchedulerConfig``; ``eager_rotation`` turns
    DuplexKV's eager rotation on or off; the limits are the system's defaults."""

    name: str
    policy: str
    preemption: str
    eager_rotation: bool
    max_running: int
    max_batch_tokens: int
    xfer_budget_blocks: int
    source: str

    def scheduler(
        self,
        *,
        max_running: int | None = None,
        max_batch_tokens: int | None = None,
        xfer_budget_blocks: int | None = None,
    ) -> SchedulerConfig:
        """The baseline's scheduler, with the limits a run gives in place of its own."""
        return SchedulerConfig(
            policy=self.policy,
            preemption=self.preemption,
            max_running=self.max_running if max_running is None else max_running,
            max_batch_tokens=(
                self.max_batch_tokens if max_batch_tokens is None else max_batch_tokens
            ),
            xfer_budget_blocks=(
                self.xfer_budget_blocks if xfer_budget_blocks is None else xfer_budget_blocks
            ),
        )

    def rotation(self) -> RotationConfig:
        return RotationConfig(eager=self.eager_rotation)


BASELINES: dict[str, Baseline] = {
    b.name: b
    for b in (
        # vLLM 0.6.6.post1 with its V1 engine (VLLM_USE_V1=1), the baseline of SuperInfer
        # §5.2 (and the base of SuperInfer's own fork). Read from the release's sources
        # (vllm-0.6.6.post1, the same lines in 0.6.6):
        # - vllm/engine/arg_utils.py:211-213: max_num_seqs defaults to 1024 under V1
        #   (256 under V0); arg_utils.py:1258-1279, _override_v1_engine_args: chunked
        #   prefill always on, max_num_batched_tokens 2048 for the OpenAI server.
        # - vllm/v1/core/scheduler.py:106-174: running requests are scheduled first;
        #   132-147: out of blocks, the last running request is preempted by recompute
        #   (blocks freed, num_computed_tokens = 0, waiting.appendleft); 177: nothing is
        #   admitted in a step that preempted; vllm/v1/engine/core.py:85: no CPU blocks,
        #   so nothing is swapped, and no block is copied ahead of a preemption.
        # Not modelled: V1 lets at most one request be partly prefilled at a time
        # (scheduler.py:107-111) and skips admissions in a step that preempted.
        Baseline(
            name="vllm",
            policy="fcfs",
            preemption="recompute",
            eager_rotation=False,
            max_running=1024,
            max_batch_tokens=2048,
            xfer_budget_blocks=0,
            source="vLLM 0.6.6.post1 V1 engine: vllm/engine/arg_utils.py:211-213, "
            "1258-1279; vllm/v1/core/scheduler.py:106-177; vllm/v1/engine/core.py:85",
        ),
        # SuperInfer (RotaSched + DuplexKV) as its released evaluation ran it
        # (Supercomputing-System-AI-Lab/SuperInfer@790d1fad, AE_AIO_0309_v1.py:52-74):
        # LVF, VLLM_USE_V1=1, --max-num-seqs 16384 --max-num-batched-tokens 16384,
        # --swap-space 400 (GiB; the simulator's host reserve leaves 400 of Grace's 480 GB,
        # ``SimConfig.host_reserve_bytes``), --proactive-swap-budget 2400 (B_xfer = 2400,
        # paper §5.2, of 4 MB blocks for Qwen2.5-32B, §4.3.1), swap preemption with eager
        # rotation.
        Baseline(
            name="superinfer",
            policy="lvf",
            preemption="swap",
            eager_rotation=True,
            max_running=16384,
            max_batch_tokens=16384,
            xfer_budget_blocks=2400,
            source="SuperInfer §5.2; Supercomputing-System-AI-Lab/SuperInfer@790d1fad "
            "AE_AIO_0309_v1.py:52-74",
        ),
    )
}


def get_baseline(name: str) -> Baseline | None:
    """The baseline called ``name``, None for a plain policy name."""
    return BASELINES.get(name)
