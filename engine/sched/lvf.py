"""RotaSched's Largest-VLT-First (SuperInfer Algorithm 1)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain
from operator import attrgetter

from shunter.engine.request import (
    Request,
    slo_lost,
    slo_slack,
    tbt_lost,
    tbt_slack,
    ttft_slack,
    vlts,
)
from shunter.engine.sched.policy import Decision, Policy, PolicyInput, by_arrival
from shunter.engine.sched.room import Room
from shunter.engine.sched.turn_length import SWITCH_COST_FACTOR


class LvfPolicy(Policy):
    """Largest-VLT-First, every step, over two resources: free device blocks and free
    running slots (the running cap).

    1. Contention check: if the free blocks hold every waiting and rotary request and
       the free slots take them all, admit in arrival order (FCFS) and stop.
    2. Sort all requests by VLT, descending (equal VLTs: the higher tenant priority
       first, where the input gives priorities).
    3. Prioritize: with ``left = free + B_xfer``, take non-running requests with
       VLT >= 0 from the head whose blocks fit in ``left``, as long as a slot is free
       or can be freed: by preempting the next running request with VLT < 0 from the
       tail, while the blocks of those so taken stay below B_xfer (B_xfer bounds what a
       step rotates, for slots as for blocks), and only if Algorithm 1 would preempt it
       for blocks anyway once the request is taken, or the request lags (VLT > 0) and
       that victim has run (-VLT) longer than it has lagged. The first request refused a
       slot ends the step's admissions: the ones after it lag less, and the slots it
       waits for go to it first.
    4. Preempt: ``need = B_xfer - left`` blocks and as many slots as the prioritized
       requests lack; from the tail, preempt running requests with VLT < 0 (whose KV
       host memory can take) until both are covered.

    Over several models (one decision over every executing model, in bytes) free memory
    is counted pool by pool (``room.Room``): a candidate fits in its own model's free
    blocks, the free pages it may claim and what other models hold free beyond their
    floors; what it needs beyond that comes from rotation, within B_xfer, and step 4
    preempts, for each pool, requests whose memory that pool can use (its own model's,
    or a model's beyond its floor). With one model this is ``left = free + B_xfer``.

    With a slot for every candidate this is Algorithm 1 of the paper: the check is its
    line 3, the slot count never binds and the preemption stops on blocks alone. The
    slot count only adds what the cap demands: a request is prioritized only if a slot
    is free or can be freed for it, and a request is preempted only while the
    prioritized ones lack blocks or slots, so nothing is rotated out for blocks or
    slots that no prioritized request will use. Freeing a slot alone (memory has room)
    asks more than a VLT >= 0: the request must lag (VLT > 0) and its victim must have
    run longer than it has lagged. Requests within their tolerance (VLT 0) free no slot,
    so a full cap with memory to spare does not time-slice while nobody lags; a request
    just swapped in keeps its slot until it has run as long as the others lag, so slots
    turn over at the pace of the lag, not every step; and a request lagging more than
    every running request has run waits for the slots finishing requests free.

    Running requests have VLT <= 0 and the others VLT >= 0, so the sorted list is the
    non-running requests by VLT followed by the running ones by VLT; sorting the two
    groups apart gives the same order (Python's sort is stable) at lower cost. Each
    request's VLT is computed once per step, and the tail is sorted only when a
    preemption is considered.
    """

    name = "lvf"
    rotates = True
    # Whether a candidate may count on rotation only for what the requests this policy
    # would preempt hold. Algorithm 1 counts on B_xfer alone: every running request
    # with VLT < 0 may go. A policy that spares some (``_victims``) must not promise a
    # candidate memory nobody will give back.
    rotation_bounded_by_victims = False
    # Whether some candidates may be lost (``_lost``): ordered last, rotating nobody out.
    sheds = False

    def schedule(self, state: PolicyInput) -> Decision:
        candidates = [*state.waiting, *state.rotary]
        costs = state.blks(candidates)
        if len(candidates) <= state.num_free_slots and state.free_room.ledger().fits_all(
            candidates, costs
        ):
            return Decision(admit=by_arrival(candidates))
        return self._prioritize(state, candidates, costs)

    def _victims(self, state: PolicyInput, max_lag: float) -> Iterator[Request]:
        """The running requests that may be preempted, first to go first, when the most
        lagging candidate has VLT ``max_lag``."""
        return _tail_first(state)

    def _rotates_for(self, r: Request, vlt: float, now: float) -> bool:
        """Whether candidate ``r``, with VLT ``vlt``, may take blocks that rotation frees
        (B_xfer), not only free ones: in Algorithm 1 every candidate with VLT >= 0."""
        return True

    def _lost(self, r: Request, state: PolicyInput) -> bool:
        """Whether candidate ``r`` can no longer meet its SLO whatever is done for it:
        such a candidate goes after every other and rotates nobody out. Algorithm 1
        counts no request lost."""
        return False

    def _prioritize(
        self, state: PolicyInput, candidates: list[Request], costs: list[int]
    ) -> Decision:
        """Steps 2-4 (sort, prioritize, preempt) once the contention check failed.

        Free memory is counted pool by pool (``PolicyInput.room``): a candidate takes its
        own model's free blocks, the spare ones and its claim on the free pages
        (``Ledger.available``), and what it needs beyond them comes from rotation, within
        B_xfer, by preempting requests whose memory its model can use (``Room.helps``).
        With one pool this is ``left = free + B_xfer`` of Algorithm 1.
        """
        slots, now = state.num_free_slots, state.now

        lag = vlts(candidates, now)
        # The largest VLT first; on equal VLT the higher tenant priority (stable sort:
        # then the order given).
        priority = state.priority
        if priority is None:
            head = sorted(range(len(candidates)), key=lag.__getitem__, reverse=True)
        else:
            ranks = [priority(r) for r in candidates]
            head = sorted(range(len(candidates)), key=lambda i: (lag[i], ranks[i]), reverse=True)
        lost: set[int] = set()  # indices of lost candidates: none unless the policy sheds
        if self.sheds:
            # Candidates that can still meet their SLO before the lost, each in that order.
            lost = {i for i, r in enumerate(candidates) if self._lost(r, state)}
            head = [i for i in head if i not in lost] + [i for i in head if i in lost]
        max_lag = lag[head[0]] if head and head[0] not in lost else 0.0
        xfer = xfer_left = state.xfer_budget
        room = state.free_room
        pool = room.pool
        free = room.ledger()
        tail = self._victims(state, max_lag)
        victims: list[Request] = []  # the head of ``tail``, pulled as slots are needed
        victim_blocks = 0
        # Per pool, what its admissions take beyond its room: step 4 rotates that out.
        rotated: dict[str, int] = {}
        rotatable: _Rotatable | None = None
        pulled: dict[str, int] = {}  # per pool, what the victims pulled for slots free
        decision = Decision()
        admit = decision.admit
        for i in head:  # every non-running VLT is >= 0
            if xfer_left <= 0 and not free.any_available():
                break
            r, cost, p = candidates[i], costs[i], pool(candidates[i])
            own = free.available(p)
            short = max(0, cost - own)
            if short > xfer_left or (
                short and (i in lost or not self._rotates_for(r, lag[i], now))
            ):
                continue
            if short and self.rotation_bounded_by_victims:
                if rotatable is None:
                    # The rest of the tail, sorted once: step 4 preempts from it too.
                    rest = list(tail)
                    tail = iter(rest)
                    held = [(pool(v), state.blk(v)) for v in (*victims, *rest)]
                    rotatable = _Rotatable(room, held)
                if not rotatable.covers(rotated, p, short):
                    continue
            if len(admit) >= slots + len(victims):
                # Another slot, from the tail, while the transfer budget lasts.
                victim = next(tail, None) if victim_blocks < xfer else None
                if victim is None:
                    break
                # If the victims so far free less than taking i leaves its pool to
                # rotate, Algorithm 1 preempts this one for blocks anyway.
                helps = room.helps(pool(victim), p)
                for_blocks = helps and pulled.get(p, 0) < rotated.get(p, 0) + short
                if not for_blocks and not frees_slot(lag[i], victim, now):
                    break
                victims.append(victim)
                nbytes = state.blk(victim)
                victim_blocks += nbytes
                credit = p if helps else pool(victim)
                pulled[credit] = pulled.get(credit, 0) + nbytes
            admit.append(r)
            free.take(p, cost - short)
            if short:
                rotated[p] = rotated.get(p, 0) + short
                xfer_left -= short

        # Step 4: preempt until the slots and every pool's rotated blocks are covered.
        need_slots = len(admit) - slots
        for r in chain(victims, tail):
            if need_slots <= 0 and not any(n > 0 for n in rotated.values()):
                break
            vp = pool(r)
            target = next((q for q, n in rotated.items() if n > 0 and room.helps(vp, q)), None)
            if target is None and need_slots <= 0:
                continue  # its memory serves no pool that lacks any
            decision.preempt.append(r)
            need_slots -= 1
            if target is not None:
                rotated[target] -= state.blk(r)
        return decision


class LvfPlusPolicy(LvfPolicy):
    """LVF that rotates only where rotation pays for itself.

    - **Memory, not the running cap, triggers it.** When the free blocks hold every
      waiting and rotary request, they are admitted in arrival order up to the free
      slots and nobody is preempted: a full running cap is a compute limit, and
      rotating for it only trades one request's progress for another's at the price of
      two copies. (Algorithm 1 frees slots for lagging requests; this does not.)
    - **Only for a request that lags and can still meet its SLO.** A candidate within
      its tolerance (VLT 0) is admitted into free blocks only; nobody is rotated out for
      it, since it meets its SLO waiting for them (and the request rotated out would
      wait for the memory it holds, not for its VLT to come first). Nor for a waiting
      request already past its TTFT target: a rotation would put another request's
      TBT at risk for an SLO already missed. It still takes free blocks first, by its
      lag.
    - **Only a request that can afford the time out is rotated out.** A running request
      is preempted only if its TBT slack (``tbt_slack``: how long it may pause and still
      meet its TBT SLO, a mean time per output token) covers its time out: its KV's
      round trip over the link (``swap_s``), the wait on the host until LVF takes it
      back (``time_out``: until its VLT overtakes the most lagging candidate's) and one
      more token gap. A request just rotated in, or one behind its SLO, has no such
      slack and keeps running: rotation never pushes a request past its TBT target, and
      the same requests do not cycle through the link every step. The wait is counted
      against the most lagging candidate now, admitted this step or not, so it errs
      long: toward keeping a request running.
    - **Only once it ran long enough to pay for its rotation.** A rotation costs its
      request the round trip of its KV and the step it sits out while its copies land
      (``step_s``, the last step's duration); a request is rotated out only after it
      has run ``SWITCH_COST_FACTOR`` (k = 4, as for temporal turns) times that since
      it was brought in, so at most a fifth of its time goes to rotating. Without
      it, slack regained in two or three fast tokens made a request eligible again,
      and requests cycled through the link every few tokens (SIMULATED, c1 temporal
      at 8 req/s: 119 rotations per request, 11 TB copied back in 105 s).
    - **Only on memory somebody gives back.** A candidate that needs more than the free
      blocks is taken only if the running requests lvf+ may rotate out hold it for its
      pool, beyond what the candidates taken before it lack (``_Rotatable``).
      Algorithm 1 counts on B_xfer whoever runs; with the requests it spares, a
      candidate so taken found no room, took the free blocks on paper and stopped its
      model's admissions behind it (SIMULATED, ``bench isolation --on sim --scenario
      c2``: the victim's 13-token prompt waited 8.4 s behind its own rotated-out
      request, for which nobody was preempted).
    - **A decode out of blocks takes them from a request whose SLO is out of reach,
      then from one behind it.** Passive preemption (``passive_victim``) preempts a
      running request of the model that can no longer meet both its SLOs
      (``slo_lost``: its first token came late, or its TBT target is out of reach at
      one token a step) first, then one with no slack left (``slo_slack`` < 0: behind
      its TBT pace, but able to catch up), then one that can still meet its SLO, the
      latest arrival first within each group (vLLM's rule). Rotated out, a request
      waits until its VLT overtakes the waiting requests' (``time_out``), seconds when
      the engine is overloaded, and the latest arrival, often a request just admitted,
      has no slack for that wait (SIMULATED, c1 spatial at 4 req/s on the Oneiros
      check's settings: 93 of combined+'s 153 requests past their TBT target had been
      preempted only passively). And a request merely behind its pace is often one
      LVF has just brought back because it lagged: taken out again by the next decode
      that finds no block, it paid a round trip for nothing, while one already lost
      misses no SLO more by waiting (SIMULATED, c2 spatial at 4 req/s, seed 3:
      combined+ from 16.2% to 25.9% of requests within both SLOs; docs/engine.md).

    - **Steps paced to the tightest TBT** (``paces``): a spatial model whose requests
      all have slack for two steps sits out a step that would run past the tightest TBT
      target among the requests in decode (``pacing.Pacing``).

    Everything else is Algorithm 1 as ``lvf`` runs it.
    """

    name = "lvf+"
    paces = True
    rotation_bounded_by_victims = True

    def schedule(self, state: PolicyInput) -> Decision:
        candidates = [*state.waiting, *state.rotary]
        costs = state.blks(candidates)
        if state.free_room.ledger().fits_all(candidates, costs):
            return Decision(admit=by_arrival(candidates)[: state.num_free_slots])
        return self._prioritize(state, candidates, costs)

    def passive_victim(
        self, running: Iterable[Request], now: float, step_s: float | None = None
    ) -> Request:
        return max(
            running,
            key=lambda r: (slo_lost(r, now, step_s), slo_slack(r, now) < 0.0, r.t_arr),
        )

    def _rotates_for(self, r: Request, vlt: float, now: float) -> bool:
        # A candidate within its tolerance (VLT 0) meets its SLO waiting for free blocks,
        # and one whose first token is already late has no SLO left to gain by it.
        return vlt > 0.0 and ttft_slack(r, now) > 0.0

    def _victims(self, state: PolicyInput, max_lag: float) -> Iterator[Request]:
        swap_s, now = state.swap_s, state.now
        step_s = 0.0 if state.step_s is None else state.step_s
        for r in _tail_first(state):
            trip = 0.0 if swap_s is None else swap_s(r)
            assert r.t_run is not None
            if now - r.t_run < SWITCH_COST_FACTOR * (trip + step_s):
                continue
            away = self._time_out(r, max_lag) + r.slo.tbt_s + trip
            if tbt_slack(r, now) >= away:
                yield r

    def _time_out(self, r: Request, max_lag: float) -> float:
        """Seconds running request ``r``, rotated out now, is expected to wait on the
        host: until its VLT overtakes the most lagging candidate's (``time_out``)."""
        return time_out(r, max_lag)


class LvfShedPolicy(LvfPlusPolicy):
    """lvf+ that sheds under overload: requests that can no longer meet their SLO go
    after every request that still can.

    - **Lost requests go last.** A candidate is lost once its SLO is out of reach
      whatever the scheduler does: a request without its first token past its TTFT
      target, or a rotary request that misses its TBT target even if it emits every
      token it may still sample from now on, one a step (``tbt_lost``, with the last
      step's duration). Lost candidates are ordered after all others (by VLT among
      themselves), rotate nobody out, and do not count as the most lagging candidate
      a victim's time out is estimated against. They still take free blocks the others
      leave, so nothing is dropped: a lost request finishes, late.
    - **A rotated-out request waits as a new one may.** A running request is rotated
      out only if its TBT slack covers, besides its round trip and a token gap, the
      longer of LVF's estimate of its time out and its SLO class's TTFT target: the
      wait for its next token is treated as a new arrival's wait for its first, which
      the class allows S_F. Under overload LVF's estimate, made against the candidates
      of this step, falls short: those arriving later lag ahead of it too.

    Under overload every order misses some SLOs; lvf+ spreads the misses over the
    requests that wait, and this concentrates them on the requests already past their
    target. The price is the drain: a shed request starts last, and its answer runs in
    smaller batches at the end (SIMULATED figures in docs/engine.md, Scheduling).
    """

    name = "lvf+shed"
    sheds = True

    def passive_victim(
        self, running: Iterable[Request], now: float, step_s: float | None = None
    ) -> Request:
        # A request behind its SLO first, the latest arrival first within each group:
        # lvf+'s rule before it took requests out of reach first. With that rule this
        # policy's paper-setting rows moved by -2.4 to +1.7 TTFT points over four seeds
        # (SIMULATED, Qwen2.5-32B at 18 req/s, seed 0: 84.7% / 99.1% to 82.3% / 96.2%).
        return max(running, key=lambda r: (slo_slack(r, now) < 0.0, r.t_arr))

    def _lost(self, r: Request, state: PolicyInput) -> bool:
        return ttft_slack(r, state.now) <= 0.0 or tbt_lost(r, state.now, state.step_s)

    def _time_out(self, r: Request, max_lag: float) -> float:
        return max(time_out(r, max_lag), r.slo.ttft_s)


class _Rotatable:
    """What the requests a policy may preempt hold, for the pools their memory serves
    (``Room.helps``): whether rotation can still give a pool what a candidate lacks."""

    def __init__(self, room: Room, victims: list[tuple[str, int]]) -> None:
        self._room, self._victims = room, victims
        self._total = sum(n for _, n in victims)
        self._for: dict[str, int] = {}

    def covers(self, rotated: dict[str, int], pool: str, short: int) -> bool:
        """Whether the victims hold ``short`` more for ``pool`` than the candidates
        taken so far lack (``rotated``, per pool), and in all as much as all lack."""
        if pool not in self._for:
            helps = self._room.helps
            self._for[pool] = sum(n for vp, n in self._victims if helps(vp, pool))
        lacking = sum(n for n in rotated.values() if n > 0)
        return rotated.get(pool, 0) + short <= self._for[pool] and lacking + short <= self._total


def time_out(r: Request, max_lag: float) -> float:
    """Seconds a request rotated out now waits on the host before LVF brings it back,
    when the most lagging candidate lags ``max_lag``: its VLT starts at 0 and grows
    ``alpha`` per second once ``beta_B x S_B`` has passed, the candidate's grows one per
    second, and the larger VLT goes first, so it returns when alpha (t - beta_B S_B) =
    max_lag + t. With alpha <= 1 it never overtakes a lagging candidate: infinite."""
    slo = r.slo
    if max_lag <= 0.0:
        return 0.0
    if slo.alpha <= 1.0:
        return float("inf")
    return (max_lag + slo.alpha * slo.beta_b * slo.tbt_s) / (slo.alpha - 1.0)


def frees_slot(vlt: float, victim: Request, now: float) -> bool:
    """LVF's slot rule: a request whose blocks fit in the free ones takes the slot of a
    running request (``victim``) only if it lags (VLT > 0) and the victim has run longer
    than it has lagged (-VLT(victim) > VLT). A request just swapped in keeps its slot
    until it has run as long as the others lag, so slots turn over at the pace of the
    lag, not every step; a request lagging more than every runner has run waits for the
    slots that finishing requests free, which go to the largest VLT first."""
    assert victim.t_run is not None
    return 0.0 < vlt < now - victim.t_run


def num_slots_freed(lags: Iterable[float], running: Iterable[Request], now: float) -> int:
    """How many running slots the slot rule frees for requests with VLTs ``lags`` while
    memory has room: the largest VLT against the longest-running request, the next
    against the next, up to the first refused. Host space and B_xfer, which LVF also
    respects, are not counted: at most what LVF frees."""
    lagging = sorted((vlt for vlt in lags if vlt > 0.0), reverse=True)
    if not lagging:  # nobody lags: no slot is freed, and the running need no sort
        return 0
    n = 0
    tail = _longest_running(running, now)
    for vlt, victim in zip(lagging, tail, strict=False):
        if not frees_slot(vlt, victim, now):
            break
        n += 1
    return n


def _longest_running(running: Iterable[Request], now: float) -> list[Request]:
    """The running requests with VLT < 0, smallest VLT (longest running) first.

    VLT = -(now - t_run), so ascending VLT is ascending t_run; ties keep the reversed
    order of the stable descending sort. (Every running request has a ``t_run``.)
    """
    eligible = [r for r in running if r.t_run is not None and r.t_run < now]
    return sorted(reversed(eligible), key=attrgetter("t_run"))


def _tail_first(state: PolicyInput) -> Iterator[Request]:
    """The running requests LVF may preempt (VLT < 0, host memory can take their KV),
    smallest VLT first: the reversed sorted order. Lazy: the sort runs at the first
    request asked for."""
    for r in _longest_running(state.running, state.now):
        if state.can_rotate(r):
            yield r
