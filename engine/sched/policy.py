"""The policy interface: who runs, who is preempted, who is brought onto the device.

A policy sees one model's requests and counts from memory, never block tables, and
returns a Decision. The Scheduler carries it out in order and stops at the first
request that does not fit, so a decision may ask for more than the step can do.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter

from shunter.engine.request import Request
from shunter.engine.sched.room import Room


@dataclass(frozen=True)
class PolicyInput:
    """One model's state at the start of a step.

    ``running`` is in the order requests became RUNNING (oldest first); ``waiting`` in
    arrival order; ``rotary`` lists ROTARY requests whose host copies have landed (the
    others cannot be swapped in yet), in preemption order. ``blk(r)`` is the number of
    device blocks r holds (RUNNING) or needs (otherwise), ``blks`` the same for many
    requests in one call. ``xfer_budget`` is what B_xfer leaves after the swap copies
    already planned this step or still in flight.
    ``can_rotate(r)`` says whether host swap space can take a running request's KV: a
    policy preempts only those proactively. ``num_free_slots`` is how many more
    requests the running cap lets run now (engine-wide, before this decision).
    ``swap_s(r)``, where the link's rate is known, is the seconds the link takes to
    copy a running request's KV out and back in; ``step_s``, once a step has run, the
    last step's duration (a swapped-in request sits out the step its copies take).
    ``priority(r)`` is the priority of the tenant whose model r is for
    (``TenantSpec.priority``; higher first on equal lag). ``room``, for a decision over
    several models, is ``num_free_blocks`` pool by pool (``room.Room``); None: one pool.
    """

    model: str
    now: float
    running: Sequence[Request]
    waiting: Sequence[Request]
    rotary: Sequence[Request]
    num_free_blocks: int
    num_free_slots: int
    xfer_budget: int
    blk: Callable[[Request], int]
    blks: Callable[[Sequence[Request]], list[int]]
    can_rotate: Callable[[Request], bool]
    swap_s: Callable[[Request], float] | None = None
    step_s: float | None = None
    priority: Callable[[Request], int] | None = None
    room: Room | None = None

    @property
    def free_room(self) -> Room:
        """``room``, or every free block in one pool."""
        return self.room if self.room is not None else Room.one(self.num_free_blocks)


@dataclass
class Decision:
    """``preempt``: RUNNING requests to rotate out, in order. ``admit``: WAITING and
    ROTARY requests to bring onto the device, in priority order."""

    preempt: list[Request] = field(default_factory=list)
    admit: list[Request] = field(default_factory=list)


class Policy(ABC):
    """A scheduling policy: ``schedule`` decides proactive preemption and admission
    for one model and one step. (Passive preemption, when a decode finds no free block,
    is the Scheduler's; the policy only names its victim, ``passive_victim``.)

    ``rotates``: the policy decides over every executing model at once, in bytes, and
    may preempt proactively within B_xfer (the LVF family); the others decide per model,
    in blocks, and preempt nothing by choice. ``paces``: a spatial model whose requests
    all have slack may sit out a step that would run past a tighter TBT target
    (``pacing.Pacing``); the others run every executing model every step, as separate
    serving instances would.
    """

    name: str
    rotates: bool = False
    paces: bool = False

    @abstractmethod
    def schedule(self, state: PolicyInput) -> Decision: ...

    def passive_victim(
        self, running: Iterable[Request], now: float, step_s: float | None = None
    ) -> Request:
        """The running request to preempt when a decode of its model finds no block
        (``step_s``: the last step's duration, once a step has run): the latest arrival
        (vLLM's passive preemption)."""
        return max(running, key=attrgetter("t_arr"))


def by_arrival(*groups: Sequence[Request]) -> list[Request]:
    """All requests of ``groups`` by arrival time (stable for ties)."""
    return sorted(chain(*groups), key=attrgetter("t_arr"))


def admit_fitting(
    candidates: Sequence[Request], free: int, blk: Callable[[Request], int]
) -> list[Request]:
    """The head of ``candidates`` whose blocks fit in ``free``: stop at the first that
    does not (head-of-line blocking, as in FCFS serving systems)."""
    admitted = []
    for r in candidates:
        need = blk(r)
        if need > free:
            break
        admitted.append(r)
        free -= need
    return admitted
