"""RequestQueues: a request preempted to recompute waits again at its place by arrival."""

from __future__ import annotations

from shunter.engine.config import SloSpec
from shunter.engine.request import Request, RequestState
from shunter.engine.sched.queues import RequestQueues


def request(rid: str, t_arr: float) -> Request:
    slo = SloSpec("default", ttft_s=5.0, tbt_s=0.1)
    return Request(id=rid, model="m", prompt_tokens=4, max_output_tokens=4, slo=slo, t_arr=t_arr)


def test_a_request_preempted_to_recompute_waits_ahead_of_later_arrivals() -> None:
    q = RequestQueues()
    first, second, third, fourth = (request(str(i), float(i)) for i in range(4))
    for r in (first, second, third, fourth):
        q.waiting[r.id] = r
    q.move(second, RequestState.RUNNING)
    q.move(first, RequestState.RUNNING)
    q.move(first, RequestState.WAITING)  # preempted: back ahead of 2 and 3
    assert list(q.waiting) == ["0", "2", "3"]
    q.move(second, RequestState.WAITING)
    assert list(q.waiting) == ["0", "1", "2", "3"]
    assert list(q.running) == []
