"""The remapper: carries the controller's decisions out on memory and into the plan.

Every step, ``plan`` builds each model's ModelState from what the scheduler knows (who
is active, when each last ran) and the measured timings, asks the controller for
targets, and for each target picks the layers (``layers.select``), works out the frames
(``frames.transition``) and moves pages:

- frames handed to the KV cache become free pages at once (``plan.remapped``);
- frames taken back are vacated first: their free pages become weights at once, and
  the live KV blocks in them move out device-to-device (``plan.moves``), possibly over
  several steps; then the layers that become resident are loaded (``plan.restored``).

``stream`` lists the slot prefetches of the models in the batch (``plan.streams``);
``observe`` folds the executor's forward times into T_compute.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from shunter.engine.config import EngineConfig, ModelSpec
from shunter.engine.memory.kv_memory import KVMemory
from shunter.engine.plan import SlotStream, StepPlan, StepResult
from shunter.engine.remap.controller import ModelState, Pressure, RemapController
from shunter.engine.remap.frames import WeightMap, transition
from shunter.engine.remap.layers import select
from shunter.engine.remap.timing import LayerTiming, MeasuredTimings


class Remapper:
    """Parameter remapping for every model of one engine.

    ``timings`` gives each model's T_T and prior forward times (``LayerTiming``).
    ``maps`` holds each model's current WeightMap.
    """

    def __init__(
        self, config: EngineConfig, memory: KVMemory, timings: Mapping[str, LayerTiming]
    ) -> None:
        missing = set(config.model_by_name) - set(timings)
        if missing:
            raise ValueError(f"remapping needs timings for {sorted(missing)}")
        self.memory = memory
        headroom = int(config.remap.headroom_fraction * memory.arena.total_bytes)
        self.controller = RemapController(config.remap, headroom=headroom)
        self.times = MeasuredTimings(dict(timings), config.remap.ewma_weight)
        self.num_layers = {m.name: m.num_layers for m in config.models}
        self.priority = {m: t.priority for m, t in config.tenant_by_model.items()}
        self.maps = {m.name: WeightMap.initial(m.num_layers) for m in config.models}
        self._vacating: set[tuple[str, int]] = set()
        self._pending: dict[str, int] = {}  # targets whose frames are still vacating

    def set_priorities(self, priority: Mapping[str, int]) -> None:
        """Replace the models' priorities (which model lends layers first) from the
        next step on; the layers lent stay lent until the controller decides again."""
        if set(priority) != set(self.priority):
            raise ValueError(f"priorities of {sorted(self.priority)} wanted")
        self.priority = dict(priority)

    def add_model(self, model: ModelSpec, timing: LayerTiming, priority: int) -> None:
        """Remap one more model from the next step on, all its layers resident."""
        self.times.add(model.name, timing)
        self.num_layers[model.name] = model.num_layers
        self.priority[model.name] = priority
        self.maps[model.name] = WeightMap.initial(model.num_layers)

    def remove_model(self, model: str) -> None:
        """Forget a model (its frames are the memory's to give back)."""
        self.times.forget(model)
        del self.num_layers[model], self.priority[model], self.maps[model]
        self._pending.pop(model, None)
        self._vacating = {(m, f) for m, f in self._vacating if m != model}

    @property
    def is_vacating(self) -> bool:
        """Whether frames are on their way back from the KV cache."""
        return bool(self._vacating)

    @property
    def vacating_bytes(self) -> int:
        """Bytes of the frames on their way back: capacity the KV cache must make room
        for elsewhere."""
        return sum(self.memory.frame_bytes(model) for model, _ in self._vacating)

    def alpha(self) -> dict[str, int]:
        """Layers remapped per model now."""
        return {m: wmap.alpha for m, wmap in self.maps.items()}

    def plan(
        self,
        plan: StepPlan,
        pressure: Pressure,
        *,
        active: Collection[str],
        t_last_active: Mapping[str, float],
        run_next: Sequence[str],
        idle: bool = False,
    ) -> None:
        """Decide and carry out this step's remapping (between the memory's
        ``begin_step`` and ``end_step``); ``idle``: no request is live."""
        states = []
        for model, wmap in self.maps.items():
            t = self.times[model]
            states.append(
                ModelState(
                    name=model,
                    num_layers=self.num_layers[model],
                    frame_bytes=self.memory.frame_bytes(model),
                    priority=self.priority[model],
                    active=model in active,
                    t_last_active=t_last_active[model],
                    alpha=wmap.alpha,
                    t_transfer=t.t_transfer,
                    t_decode=t.t_decode,
                    t_prefill=t.t_prefill,
                )
            )
        decision = self.controller.plan(states, pressure, run_next, idle=idle)
        # A take-back under way goes on to its target unless the controller now wants
        # something else for that model: frames half vacated are memory nobody uses.
        targets = decision.targets | {
            m: t for m, t in self._pending.items() if m not in decision.targets
        }
        self._pending = {}
        vacating: set[tuple[str, int]] = set()
        by_name = {state.name: state for state in states}
        # Restores first, the model most likely to run next first: its frames are freed
        # of KV, and its layers loaded, before the others'. Reclaims keep the
        # controller's order.
        rank = {name: i for i, name in enumerate(run_next)}
        order = sorted(
            targets,
            key=lambda m: (0, rank.get(m, len(rank))) if targets[m] < by_name[m].alpha else (1, 0),
        )
        for model in order:
            state, target = by_name[model], targets[model]
            if target != state.alpha:
                self._apply(plan, state, target, vacating)
        for model, frame in sorted(self._vacating - vacating):  # sorted: not hash order
            if frame in self.maps[model].reclaimed:  # not taken back after all
                self.memory.cancel_vacate(model, frame)
        self._vacating = vacating

    def _apply(
        self, plan: StepPlan, state: ModelState, target: int, vacating: set[tuple[str, int]]
    ) -> None:
        model, wmap, memory = state.name, self.maps[state.name], self.memory
        t_layer = state.t_compute / state.num_layers
        layout = select(
            state.num_layers, target, state.t_transfer, t_layer, keep=wmap.layout.streamed
        )
        t = transition(wmap, layout, sorted(wmap.reclaimed))
        if t.take_back:
            # Frames already on their way back first, then those holding the least KV.
            cost = memory.frame_costs(model, wmap.reclaimed)
            order = sorted(
                wmap.reclaimed, key=lambda f: ((model, f) not in self._vacating, cost[f], f)
            )
            t = transition(wmap, layout, order)
        if t.take_back:
            vacated = [memory.vacate_frame(model, f) for f in t.take_back]
            if not all(vacated):
                vacating.update((model, f) for f in t.take_back)
                self._pending[model] = target
                return
        for frame in t.reclaim:
            memory.release_frame(model, frame)
        if t.reclaim:
            plan.remapped[model] = list(t.reclaim)
        if t.loads:
            plan.restored[model] = list(t.loads)
        self.maps[model] = t.after

    def stream(self, plan: StepPlan) -> None:
        """Record the slot prefetches of every model in ``plan.batch`` with remapped
        layers (call once the batch is complete)."""
        for model in {e.model for e in plan.batch}:
            wmap = self.maps[model]
            if wmap.alpha:
                plan.streams[model] = SlotStream(wmap.layout.streamed, wmap.slots)

    def observe(self, plan: StepPlan, result: StepResult) -> None:
        """Fold each model's measured forward pass into its T_compute estimates, and its
        layer copies into its T_T."""
        prefilling = {e.model for e in plan.batch if e.is_prefill}
        for model, seconds in result.compute_s.items():
            self.times.observe(model, seconds, prefill=model in prefilling)
        for model, seconds in result.copy_s.items():
            self.times.observe_copy(model, seconds)
