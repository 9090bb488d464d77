"""The three seams between EngineCore and the world: Clock, Executor, Transfers.

The torch executor and the simulator implement the same interfaces, so the scheduler,
memory manager and step loop never know which one drives them.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from shunter.engine.plan import StepPlan, StepResult


class Clock(ABC):
    """The engine's time source, in seconds. Monotonic, never decreasing.

    The simulator's virtual clock advances only when its executor or event loop moves
    it; EngineCore reads ``now()`` at the start of a step (scheduling, VLT) and again
    after ``Executor.execute`` returns (token emission times).
    """

    @abstractmethod
    def now(self) -> float: ...


class MonotonicClock(Clock):
    """Wall time from ``time.monotonic()``, for the real engine."""

    def now(self) -> float:
        return time.monotonic()


class Executor(ABC):
    """Runs one step's forward pass.

    Contract for ``execute(plan)``:
      - Before reading KV, perform ``plan.moves`` (device-to-device block moves).
      - Run ``plan.batch``: for each entry compute KV for its token range through the
        request's block table and, where ``samples`` is set, sample one token.
      - A request swapped in by an earlier plan must not be read before that plan's
        H2D batch has completed (the torch executor makes the compute stream wait on
        the copy's event; a simulator starts the step no earlier than the copy's
        completion). The engine relies on this: once such a request has been computed,
        its H2D copies are done, whether or not ``Transfers.poll`` reported them yet.
      - Return when the step's tokens are known, with one ``emitted`` entry per sampling
        batch entry and ``duration_s`` the step's device time. A simulated executor
        advances its virtual clock by that duration before returning.
      - Drop per-request state for ``plan.released``.
    The plan's D2H and H2D copies are not the executor's: ``Transfers`` runs them.

    With async scheduling (``EngineConfig.async_scheduling``) the engine splits a step in
    two: ``forward(plan)`` runs on a worker thread while the engine plans the next step
    and hands out the last one's outputs, then ``sample(plan, forwarded)`` runs on the
    engine's thread and returns what ``execute`` would. ``forward`` must not touch what
    the engine's thread reads between steps (a request's text, logprobs or stop state).
    A plan made while the previous one ran may hold a request that the previous one
    stopped (EOS, stop string): the executor may compute its entry and need not sample
    it. The defaults run all of ``execute`` as ``forward``.
    """

    @abstractmethod
    def execute(self, plan: StepPlan) -> StepResult: ...

    def forward(self, plan: StepPlan) -> object:
        """The part of ``execute`` that may run beside the engine's thread."""
        return self.execute(plan)

    def sample(self, plan: StepPlan, forwarded: object) -> StepResult:
        """The rest of ``execute``, given what ``forward(plan)`` returned."""
        if not isinstance(forwarded, StepResult):
            raise TypeError(f"forward returned {type(forwarded).__name__}, not a StepResult")
        return forwarded


class Transfers(ABC):
    """Moves KV blocks between device and host, overlapped with compute (DuplexKV).

    Contract:
      - ``submit(plan)`` starts the plan's two batches at once, one per direction:
        D2H = ``plan.d2h(model)`` for every model, H2D = ``plan.swap_in``. It must not
        block on them. The engine guarantees that no H2D copy writes a block that a
        copy still in flight reads or writes, and no D2H copy reads a block an H2D copy
        still writes, so the two directions may run concurrently. Nor does a D2H copy
        read a block the plan's ``moves`` write: the executor moves blocks after
        ``submit``, so a block moved this step is copied from its move's source.
      - ``poll(now)`` returns the steps whose batches (both directions) have completed
        by ``now`` and were not reported before, in increasing order. Steps without
        copies may be reported at once. Every submitted step is eventually reported.
    Until a step is reported the engine keeps its source and destination blocks
    reserved: a device block freed by a preemption is reused only after its D2H copy
    completed, and a host block is reused only after every copy touching it completed.
    """

    @abstractmethod
    def submit(self, plan: StepPlan) -> None: ...

    @abstractmethod
    def poll(self, now: float) -> list[int]: ...
