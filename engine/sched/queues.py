"""One model's requests by state, each queue in the order requests entered it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from shunter.engine.request import Request, RequestState

# Module constants: an enum member looked up on its class costs a Python-level call,
# and ``move`` runs for every request that changes state.
WAITING, RUNNING, ROTARY = RequestState.WAITING, RequestState.RUNNING, RequestState.ROTARY
FINISHED = RequestState.FINISHED


@dataclass
class RequestQueues:
    """WAITING, RUNNING and ROTARY requests of one model, keyed by id.

    Dicts keep insertion order and remove in O(1): ``running`` is in the order requests
    became RUNNING, ``waiting`` in arrival order (a request preempted to recompute
    re-enters at its place, ahead of later arrivals, as vLLM puts it back at the head),
    ``rotary`` in preemption order. ROTARY requests whose host copies are still in
    flight wait in ``landing`` and cannot be swapped in yet.
    """

    waiting: dict[str, Request] = field(default_factory=dict)
    running: dict[str, Request] = field(default_factory=dict)
    rotary: dict[str, Request] = field(default_factory=dict)
    landing: dict[str, Request] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.rotary) + len(self.landing)

    def of(self, state: RequestState) -> dict[str, Request]:
        if state is WAITING:
            return self.waiting
        if state is RUNNING:
            return self.running
        if state is ROTARY:
            return self.rotary
        raise ValueError("finished requests are in no queue")

    def count(self, state: RequestState) -> int:
        return len(self.of(state)) + (len(self.landing) if state is ROTARY else 0)

    def move(self, request: Request, state: RequestState, *, landing: bool = False) -> None:
        """Move ``request`` to ``state``'s queue (``landing`` for a ROTARY request whose
        copies are in flight) and set its state."""
        # RUNNING first: LVF moves many requests in and out of it every step.
        rid, old = request.id, request.state
        if old is RUNNING:
            del self.running[rid]
        elif old is ROTARY and rid in self.landing:
            del self.landing[rid]
        else:
            del self.of(old)[rid]
        request.state = state
        if state is FINISHED:
            return
        if landing:
            self.landing[rid] = request
        elif state is RUNNING:
            self.running[rid] = request
        elif state is WAITING:
            self._wait(request)
        else:
            self.of(state)[rid] = request

    def _wait(self, request: Request) -> None:
        """Put ``request`` into ``waiting`` at its place by arrival, in place."""
        waiting, later = self.waiting, []
        for r in reversed(waiting.values()):
            if r.t_arr <= request.t_arr:
                break
            later.append(r)
        for r in later:
            del waiting[r.id]
        waiting[request.id] = request
        for r in reversed(later):
            waiting[r.id] = r

    def land(self, has_landed: Callable[[Request], bool]) -> None:
        """Move landing requests whose copies completed to ``rotary``, in order."""
        for rid, r in list(self.landing.items()):
            if has_landed(r):
                del self.landing[rid]
                self.rotary[rid] = r
