"""One model's requests by state, each queue in the order requests entered it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from shunter.engine.request import Request, RequestState

ROTARY = RequestState.ROTARY


@dataclass
class RequestQueues:
    """WAITING, RUNNING and ROTARY requests of one model, keyed by id.

    Dicts keep insertion order and remove in O(1): ``running`` is in the order requests
    became RUNNING, ``waiting`` in arrival order (recompute preemptions re-enter at the
    back), ``rotary`` in preemption order. ROTARY requests whose host copies are still in
    flight wait in ``landing`` and cannot be swapped in yet.
    """

    waiting: dict[str, Request] = field(default_factory=dict)
    running: dict[str, Request] = field(default_factory=dict)
    rotary: dict[str, Request] = field(default_factory=dict)
    landing: dict[str, Request] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.rotary) + len(self.landing)

    def of(self, state: RequestState) -> dict[str, Request]:
        if state is RequestState.WAITING:
            return self.waiting
        if state is RequestState.RUNNING:
            return self.running
        if state is ROTARY:
            return self.rotary
        raise ValueError("finished requests are in no queue")

    def count(self, state: RequestState) -> int:
        return len(self.of(state)) + (len(self.landing) if state is ROTARY else 0)

    def move(self, request: Request, state: RequestState, *, landing: bool = False) -> None:
        """Move ``request`` to ``state``'s queue (``landing`` for a ROTARY request whose
        copies are in flight) and set its state."""
        if request.state is ROTARY and request.id in self.landing:
            del self.landing[request.id]
        else:
            del self.of(request.state)[request.id]
        request.state = state
        if state is not RequestState.FINISHED:
            (self.landing if landing else self.of(state))[request.id] = request

    def land(self, has_landed: Callable[[Request], bool]) -> None:
        """Move landing requests whose copies completed to ``rotary``, in order."""
        for rid, r in list(self.landing.items()):
            if has_landed(r):
                del self.landing[rid]
                self.rotary[rid] = r
