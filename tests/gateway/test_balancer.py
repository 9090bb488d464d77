"""The gateway's choice among a model's replicas: fewest in flight, turns on ties, failed
ones cooled for a while."""

from __future__ import annotations

from dataclasses import dataclass

from shunter.gateway.balancer import Balancer


@dataclass(frozen=True)
class Rep:
    deployment_id: int
    model_name: str = "m"
    engine_load: tuple[int, float] = (0, 0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


A, B, C = Rep(1), Rep(2), Rep(3)


def test_the_replica_with_fewest_requests_in_flight_takes_the_next() -> None:
    lb = Balancer()
    for _ in range(3):
        lb.started(A.deployment_id)
    lb.started(B.deployment_id)
    assert lb.pick([A, B, C]) == C
    lb.started(C.deployment_id)
    lb.started(C.deployment_id)
    assert lb.pick([A, B, C]) == B
    for _ in range(3):
        lb.finished(A.deployment_id)
    assert lb.outstanding(A.deployment_id) == 0
    assert lb.pick([A, B, C]) == A


def test_equal_replicas_take_turns_per_model() -> None:
    lb = Balancer()
    other = [Rep(7, "other"), Rep(8, "other")]
    picks = []
    for _ in range(4):
        picks.append(lb.pick([A, B]))
        lb.pick(other)  # another model's requests do not move m's turns
    assert picks == [A, B, A, B]


def test_among_equal_replicas_the_least_loaded_engine_takes_the_next() -> None:
    lb = Balancer()
    busy, idle, full = Rep(4, engine_load=(6, 0.2)), Rep(5, engine_load=(1, 0.9)), Rep(6)
    assert [lb.pick([busy, idle]) for _ in range(3)] == [idle] * 3
    assert lb.pick([busy, idle, full]) == full
    roomy = Rep(9, engine_load=(1, 0.1))
    assert lb.pick([idle, roomy]) == roomy  # then the KV usage
    lb.started(idle.deployment_id)  # in flight here counts first: the engine's is stale
    assert lb.pick([busy, idle]) == busy


def test_a_cooling_replica_takes_nothing_until_its_cooldown_ends_or_all_cool() -> None:
    clock = Clock()
    lb = Balancer(cooldown_s=5.0, clock=clock)
    lb.cool_down(A.deployment_id)
    assert [lb.pick([A, B]) for _ in range(3)] == [B, B, B]
    assert lb.is_cooling(A.deployment_id)
    lb.cool_down(B.deployment_id)
    assert {lb.pick([A, B]) for _ in range(4)} == {A, B}  # all cooling: all in play
    clock.now = 5.0
    assert not lb.is_cooling(A.deployment_id)


def test_excluded_replicas_are_never_picked() -> None:
    lb = Balancer()
    assert lb.pick([A, B], exclude={A.deployment_id}) == B
    assert lb.pick([A, B], exclude={A.deployment_id, B.deployment_id}) is None
    assert lb.pick([]) is None
