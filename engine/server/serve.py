"""Build a server from its settings: size the arena, load the models, start nothing yet."""

from __future__ import annotations

import atexit
import dataclasses
import gc

import torch

from shunter.engine.config import (
    EngineConfig,
    ModelSpec,
    SchedulerConfig,
    TenantSpec,
    default_step_target_s,
)
from shunter.engine.errors import ServeError
from shunter.engine.exec.serving import TorchEngine, model_specs
from shunter.engine.exec.sizing import KVNeed, default_host_swap_bytes, serving_config
from shunter.engine.memory.kv_memory import floors_problem
from shunter.engine.server.context import ServerState
from shunter.engine.server.loop import EngineLoop
from shunter.engine.server.metrics import ServerMetrics
from shunter.engine.server.models import ModelArg, ServedModel, load_served_model
from shunter.engine.server.settings import EngineSettings


def engine_config(settings: EngineSettings, *, check_integrity: bool = False) -> EngineConfig:
    """Without ``hbm_budget``: room for ``kv_tokens`` tokens of each model (in whole
    contexts). With it: an arena of that many bytes, which must hold one full context of
    each model. A full context is the model's configured ``max_context`` where that is
    smaller than its own (``context_tokens``). Host swap space is ``host_budget`` bytes,
    by default what ``kv_tokens`` tokens of each model take, within half the host's
    memory over all models (so with ``hbm_budget`` alone ``kv_tokens`` sizes the host
    swap space only). ServeError says what does not fit: weights, a full context, or
    the models' KV floors."""
    specs = model_specs({m.name: m.path for m in settings.models})
    full, one = [], []
    for m, spec in zip(settings.models, specs, strict=True):
        tokens = context_tokens(m, spec)
        contexts = max(1, -(-settings.kv_tokens // tokens))
        where = f"of {tokens} tokens (a full context of {spec.name})"
        need = KVNeed(where, spec.name, tokens)
        full += [need] * contexts
        one.append(need)
    config = serving_config(
        specs,
        one if settings.hbm_budget else full,
        hbm_budget=settings.hbm_budget,
        host_swap_bytes=(
            default_host_swap_bytes(specs, full)
            if settings.host_budget is None
            else settings.host_budget
        ),
        remap=settings.remap,
        check_integrity=check_integrity,
        prefix_caching=settings.prefix_caching,
        async_scheduling=settings.async_scheduling,
        enforce_eager=settings.enforce_eager,
    )
    config = dataclasses.replace(
        config,
        scheduler=SchedulerConfig(policy=settings.policy, step_target_s=step_target_s(settings)),
        tenants=tenant_specs(settings),
        remap=dataclasses.replace(config.remap, capacity_order=settings.capacity_order),
    )
    if (problem := floors_problem(config)) is not None:
        raise ServeError(f"{problem}; lower the models' kv_floor or give the arena more")
    return config


def step_target_s(settings: EngineSettings) -> float:
    """The time a step should take: ``settings.step_target_s`` when set, else a fraction
    of the tightest TBT target among the models' SLO classes, else a default."""
    if settings.step_target_s is not None:
        return settings.step_target_s
    return default_step_target_s(m.slo for m in settings.models)


def context_tokens(model: ModelArg, spec: ModelSpec) -> int:
    """A full context of the model: its configured ``max_context`` where that is set
    and smaller than the model's own."""
    if model.max_context is None:
        return spec.max_context
    return min(model.max_context, spec.max_context)


def tenant_specs(settings: EngineSettings) -> tuple[TenantSpec, ...]:
    """Each model's sharing mode, SLO class, priority and KV bounds, for the scheduler."""
    return tuple(
        TenantSpec(
            m.name,
            sharing=m.sharing,
            slo=m.slo,
            priority=m.priority,
            kv_floor=m.kv_floor or 0,
            kv_ceiling=m.kv_ceiling,
        )
        for m in settings.models
    )


def build_loop(
    settings: EngineSettings,
    device: torch.device,
    metrics: ServerMetrics,
    *,
    check_integrity: bool = False,
) -> tuple[EngineLoop, dict[str, ServedModel]]:
    """A TorchEngine over ``settings``' models in an EngineLoop (not started yet), and the
    models as the HTTP layer sees them."""
    config = engine_config(settings, check_integrity=check_integrity)
    engine = TorchEngine({m.name: m.path for m in settings.models}, config, device=device)
    served = {
        m.name: load_served_model(m, spec)
        for m, spec in zip(settings.models, config.models, strict=True)
    }
    return EngineLoop(engine, metrics), served


def freeze_heap() -> None:
    """Move every object alive now (modules, models, tokenizers: some 200,000 for two
    tiny models) out of the garbage collector's sight. A full collection walks them
    all, 31-46 ms on this project's CPU host with every thread stopped: a tenant whose
    requests churn objects (a fan-out of 128 sequences) would stall every other one's
    steps that long. Only cycles among objects made later are looked for. At exit the
    heap is unfrozen, so that extensions that count their objects at shutdown (Triton's
    nanobind bindings) find them collected."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # registered once, however often the heap is frozen
    atexit.register(gc.unfreeze)


def build_state(
    settings: EngineSettings,
    device: torch.device,
    *,
    token: str | None = None,
    metrics_token: str | None = None,
    open_metrics: bool = False,
    check_integrity: bool = False,
) -> ServerState:
    metrics = ServerMetrics([m.name for m in settings.models])
    loop, served = build_loop(settings, device, metrics, check_integrity=check_integrity)
    freeze_heap()
    return ServerState(
        models=served,
        loop=loop,
        metrics=metrics,
        settings=settings,
        token=token,
        metrics_token=metrics_token,
        open_metrics=open_metrics,
        grace_s=settings.grace_s,
    )
