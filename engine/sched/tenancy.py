"""Tenancy: which models execute in a step, and how soon the others will.

Each model is a tenant (``config.TenantSpec``) with a sharing mode and a priority:

- **spatial** models execute in every step in which they have work;
- **temporal** models take turns, one holding the turn. The turn passes when the holder
  has no work, or once it has held the turn for the quantum, to the temporal
  model of highest priority with work, and among equals the most urgent one: the one
  whose most urgent request is closest to missing its SLO (``Urgency``; the holder keeps
  the turn on a tie, so a switch is never paid for nothing). A model with a request
  that can still meet its SLO goes before one whose requests are all late: they have no
  deadline left to keep, and a late request taking the turn would make the others late
  too. Deadlines, not VLTs: a paused model's decodes lag alpha times faster than a
  waiting request, so ranked by VLT two decoding models passed the turn between them
  while a third model's new requests waited past their TTFT target (SIMULATED, c1
  temporal, 10 s windows, 2 req/s: Llama-3-8B's TTFT P99 8.6 s against a 5 s target
  under every variant).
  That order alone starves: while one model keeps a request in time, a model whose
  requests are all late never gets the turn, and its paused requests keep their KV. So
  a model whose requests are all late and that has waited for the turn for its TTFT
  target (its tenant's SLO class; no bound without one) goes before the others of its
  priority, the longest wait first, and holds the turn for a quantum. In c2 temporal at
  1 req/s (SIMULATED, seed 2, rotasched+) OPT-30B got no turn from 60 s to 120 s
  while OPT-6.7B ran 1-2 requests a step beside OPT-30B's 4 paused ones; with the
  bound the two alternate. The bound counts only for late models: applied to every
  waiting model, it handed the turn to paused decodes with slack to spare and took 8.5
  points of rotasched+'s joint attainment in c1 temporal at 4 req/s (seed 0).
  A holder with no work gives the turn up at once, even when no other model wants it:
  an idle model is inactive, so a lone temporal model lends its layers while it has
  nothing to do. A holder whose work cannot run (its requests do not fit the memory
  the others hold) passes the turn at once (``pass_turn``), so
  a turn never blocks the GPU, and never to a model that could not run either since
  memory last changed (a request finished or a holder ran): two models that cannot
  run would otherwise pass it back and forth while a third, whose running requests
  hold the memory, never gets it.

A temporal model without the turn is *inactive*: its layers are remapped first and its
requests' KV rotates out first. Spatial models and the turn holder are *active*. Where
the policy rotates, a temporal model without the turn holds no KV floor while another
holds it (``Scheduler.schedule``, ``KVMemory.suspend_floors``).

The quantum follows the measured cost of a switch (``turn_length``): at least four times
it, at most what the temporal tenants' tightest TTFT target leaves, never under the
configured minimum.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from shunter.engine.config import TenantSpec
from shunter.engine.sched.turn_length import TurnLength

Urgency = Callable[[str], tuple[bool, float]]
"""How urgent a model's work is, the larger the sooner it should run: whether any of its
requests can still meet its SLO, then minus the least SLO slack (``request.slo_slack``)
among those that can, or among all where none can (the latest first). Asked only of
models with work."""


class Tenancy:
    """Turns and activity of a set of tenants.

    Call ``executing`` once per step: it passes the turn when due, records who
    executes, and returns them. ``has_work(m)`` says whether model m has any live
    request; ``urgency(m)`` is asked only when a turn decision needs it.
    """

    def __init__(self, tenants: Sequence[TenantSpec], *, min_quantum_s: float) -> None:
        names = _names(tenants)
        self.turn_length = TurnLength(min_quantum_s)
        self.holder: str | None = None
        self.t_turn = 0.0
        self.num_switches = 0
        self.t_last_active = dict.fromkeys(names, -float("inf"))
        self._stalled: set[str] = set()  # could not run since memory last changed
        self._waiting_since: dict[str, float] = {}  # temporal models with work, no turn
        self._last_holder: str | None = None
        self._set(tenants)

    def set_tenants(self, tenants: Sequence[TenantSpec]) -> None:
        """Replace the tenants' specs (sharing, priority, SLO class, KV bounds) in place:
        the same models, one spec each. The holder keeps the turn if it stays temporal;
        otherwise no model holds it until the next ``executing`` hands it on, so a change
        of sharing mode takes effect at the next step. When each model last executed and
        the switch count stay."""
        names = _names(tenants)
        if set(names) != set(self.tenants):
            raise ValueError(f"tenants of {sorted(self.tenants)} wanted, got {names}")
        self._set(tenants)
        if self._last_holder is not None and self._last_holder not in self.temporal:
            self._last_holder = None  # handing on a turn its holder left is no switch
        if self.holder is not None and self.holder not in self.temporal:
            self.holder = None

    def add_tenant(self, tenant: TenantSpec) -> None:
        """One more model, idle so far (it never executed)."""
        if tenant.model in self.tenants:
            raise ValueError(f"model {tenant.model!r} is a tenant already")
        self._set([*self.tenants.values(), tenant])
        self.t_last_active[tenant.model] = -float("inf")

    def remove_tenant(self, model: str) -> None:
        """Forget a model; when it held the turn, the next ``executing`` hands it on."""
        self._set([t for m, t in self.tenants.items() if m != model])
        del self.t_last_active[model]
        self._stalled.discard(model)
        if self._last_holder == model:
            self._last_holder = None
        if self.holder == model:
            self.holder = None

    def _set(self, tenants: Sequence[TenantSpec]) -> None:
        self.tenants = {t.model: t for t in tenants}
        self.temporal = [t.model for t in tenants if t.sharing == "temporal"]
        self.spatial = [t.model for t in tenants if t.sharing == "spatial"]
        ttfts = [t.slo.ttft_s for t in tenants if t.sharing == "temporal" and t.slo is not None]
        # A request arriving as its model loses the turn waits out every other turn.
        self.turn_length.max_quantum_s = min(ttfts) / len(self.temporal) if ttfts else None

    @property
    def quantum_s(self) -> float:
        """The least time a holder with work keeps the turn now."""
        return self.turn_length.quantum_s

    def observe(
        self, executed: Collection[str], *, now: float, duration_s: float, compute_s: float | None
    ) -> None:
        """A step in which ``executed`` models ran ended at ``now``: what it says about
        the cost of the last switch (``TurnLength.observe``)."""
        self.turn_length.observe(
            holder_ran=self.holder is not None and self.holder in executed,
            now=now,
            duration_s=duration_s,
            compute_s=compute_s,
        )

    @property
    def paused(self) -> list[str]:
        """The temporal models that cannot run until another model's turn ends: every
        one but the holder, waiting or idle; none when no model holds the turn."""
        if self.holder is None:
            return []
        return [m for m in self.temporal if m != self.holder]

    def is_active(self, model: str) -> bool:
        return model == self.holder or self.tenants[model].sharing == "spatial"

    def executing(self, now: float, has_work: Callable[[str], bool], urgency: Urgency) -> list[str]:
        """Models that run this step: spatial ones with work, then the turn holder if it
        has work (after passing the turn if it is due)."""
        if self.temporal:
            self._pass_turn(now, has_work, urgency)
            self._waiting_since = {
                m: self._waiting_since.get(m, now)
                for m in self.temporal
                if m != self.holder and has_work(m)
            }
        models = [m for m in self.spatial if has_work(m)]
        if self.holder is not None and has_work(self.holder):
            models.append(self.holder)
        for m in models:
            self.t_last_active[m] = now
        return models

    def _pass_turn(self, now: float, has_work: Callable[[str], bool], urgency: Urgency) -> None:
        holder = self.holder
        holding = holder is not None and has_work(holder)
        if holder is not None and not holding:
            self.holder = None  # idle: inactive from now on, whoever takes the turn next
        if holding and now - self.t_turn < self.turn_length.quantum_s:
            return
        ready = [m for m in self.temporal if m != holder and has_work(m)]
        if not ready:
            return
        rank = self._rank(urgency, now)
        best = max(ready, key=rank)
        if holding and holder is not None and rank(holder) >= rank(best):
            return
        self._give(best, now)

    def _rank(self, urgency: Urgency, now: float) -> Callable[[str], tuple[int, bool, bool, float]]:
        """Who takes the turn first: the highest priority, then a model whose requests are
        all late and that has waited for the turn past its TTFT target (``_overdue_s``, the
        longest wait first), then the most urgent."""

        def rank(m: str) -> tuple[int, bool, bool, float]:
            can_meet, score = urgency(m)
            waited = None if can_meet else self._overdue_s(m, now)
            if waited is not None:
                return (self.tenants[m].priority, True, True, waited)
            return (self.tenants[m].priority, False, can_meet, score)

        return rank

    def _overdue_s(self, model: str, now: float) -> float | None:
        """How long ``model`` has waited for the turn with work, where that is past its
        TTFT target (the bound on a wait); None otherwise, or without a target."""
        since, slo = self._waiting_since.get(model), self.tenants[model].slo
        if since is None or slo is None or now - since < slo.ttft_s:
            return None
        return now - since

    def pass_turn(self, now: float, has_work: Callable[[str], bool], urgency: Urgency) -> bool:
        """The holder could not run: give the turn to the most urgent temporal model with
        work, quantum or not, leaving out the models that could
        not run either since memory last changed (``memory_changed``). False if there is
        none: the holder keeps it (turning among models that cannot run only costs
        switches) until memory changes."""
        if self.holder is not None:
            self._stalled.add(self.holder)
        ready = [m for m in self.temporal if m not in self._stalled and has_work(m)]
        if not ready:
            return False
        self._give(max(ready, key=self._rank(urgency, now)), now)
        return True

    def memory_changed(self) -> None:
        """A request finished or a holder ran: a model that could not run may now."""
        self._stalled.clear()

    def _give(self, model: str, now: float) -> None:
        # A switch is counted when the turn moves to another model than the last to
        # hold it (one that went idle and takes it back pays no switch).
        if self._last_holder is not None and self._last_holder != model:
            self.num_switches += 1
            self.turn_length.switched(now)
        self.holder, self.t_turn = model, now
        self._last_holder = model

    def run_next(self, has_work: Callable[[str], bool], urgency: Urgency) -> list[str]:
        """Every model, the ones most likely to run next first: active ones (highest
        priority first), then inactive ones with work, the most urgent first, then idle
        ones by priority, the least recently active first among equals (round robin)."""

        def key(m: str) -> tuple[int, float, float]:
            t = self.tenants[m]
            if self.is_active(m):
                return (0, -t.priority, 0.0)
            if has_work(m):
                can_meet, score = urgency(m)
                return (1, -float(can_meet), -score)
            return (2, -t.priority, self.t_last_active[m])

        return sorted(self.tenants, key=key)


def _names(tenants: Sequence[TenantSpec]) -> list[str]:
    names = [t.model for t in tenants]
    if len(set(names)) != len(names):
        raise ValueError(f"one tenant per model: {names}")
    return names
