"""One model's requests by state, each queue in the order requests entered it."""

from __future__ import annotations

from dataclasses import dataclass, field

from shunter.engine.request import Request, RequestState


@dataclass
class RequestQueues:
    """WAITING, RUNNING and ROTARY requests of one model, keyed by id.

    Dicts keep insertion order and remove in O(1): ``running`` is in the order requests
    became RUNNING, ``waiting`` in arrival order (recompute preemptions re-enter at the
    back), ``rotary`` in preemption order.
    """

    waiting: dict[str, Request] = field(default_factory=dict)
    running: dict[str, Request] = field(default_factory=dict)
    rotary: dict[str, Request] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.rotary)

    def of(self, state: RequestState) -> dict[str, Request]:
        if state is RequestState.WAITING:
            return self.waiting
        if state is RequestState.RUNNING:
            return self.running
        if state is RequestState.ROTARY:
            return self.rotary
        raise ValueError("finished requests are in no queue")

    def move(self, request: Request, state: RequestState) -> None:
        """Move ``request`` from its current queue to ``state``'s and set its state."""
        del self.of(request.state)[request.id]
        request.state = state
        if state is not RequestState.FINISHED:
            self.of(state)[request.id] = request
