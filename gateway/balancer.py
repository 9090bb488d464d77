"""Which replica of a model takes a request: least outstanding first, failed ones cooled.

The gateway process counts its own requests in flight per deployment (``started`` when
one is sent, ``finished`` when its exchange ends) and sends each new request to the
routable replica with the fewest; among equal ones, the replica whose engine reported the
least load at its last poll (``engine_load``: the model's requests queued and running
there, then its KV usage), and equal ones take turns, per model. A replica that
refused a connection, reset it or answered 503 before any byte reached the client is
put in a cooldown at once (``cool_down``): it takes no request for ``cooldown_s``
unless every replica is cooling, without waiting for the poll to mark its node down.

Process-local, like the route table: each gateway replica balances its own traffic.
Pure logic: no Django.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Protocol, TypeVar

# How long a replica that just failed takes no traffic: two of the beat's 2 s polls,
# by which time a node that is down is marked so, and one that recovered answers again.
COOLDOWN_S = 5.0


class Replica(Protocol):
    @property
    def deployment_id(self) -> int: ...

    @property
    def model_name(self) -> str: ...

    @property
    def engine_load(self) -> tuple[int, float]: ...


R = TypeVar("R", bound=Replica)


class Balancer:
    """Outstanding requests and cooldowns per deployment id (thread-safe)."""

    def __init__(
        self, *, cooldown_s: float = COOLDOWN_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._outstanding: dict[int, int] = {}
        self._cool_until: dict[int, float] = {}
        self._turns: dict[str, int] = {}

    def pick(self, replicas: Sequence[R], exclude: Collection[int] = ()) -> R | None:
        """The replica to send the next request to, None when all are ``exclude``d:
        among those not cooling (all of them, if every one is), the fewest outstanding
        requests, then the least engine load; ties take turns."""
        candidates = [r for r in replicas if r.deployment_id not in exclude]
        if not candidates:
            return None
        with self._lock:
            now = self._clock()
            warm = [r for r in candidates if self._cool_until.get(r.deployment_id, 0.0) <= now]
            pool = warm or candidates
            least = min(self._outstanding.get(r.deployment_id, 0) for r in pool)
            ties = [r for r in pool if self._outstanding.get(r.deployment_id, 0) == least]
            lightest = min(r.engine_load for r in ties)
            ties = [r for r in ties if r.engine_load == lightest]
            model = ties[0].model_name
            turn = self._turns.get(model, 0)
            self._turns[model] = turn + 1
            return ties[turn % len(ties)]

    def started(self, deployment_id: int) -> None:
        with self._lock:
            self._outstanding[deployment_id] = self._outstanding.get(deployment_id, 0) + 1

    def finished(self, deployment_id: int) -> None:
        with self._lock:
            left = self._outstanding.get(deployment_id, 0) - 1
            if left > 0:
                self._outstanding[deployment_id] = left
            else:
                self._outstanding.pop(deployment_id, None)

    def outstanding(self, deployment_id: int) -> int:
        with self._lock:
            return self._outstanding.get(deployment_id, 0)

    def cool_down(self, deployment_id: int) -> None:
        with self._lock:
            self._cool_until[deployment_id] = self._clock() + self.cooldown_s

    def is_cooling(self, deployment_id: int) -> bool:
        with self._lock:
            return self._cool_until.get(deployment_id, 0.0) > self._clock()
