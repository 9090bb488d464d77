"""What ``shunter engine`` runs: models, SLO classes and engine knobs, from ``--model``
flags and an optional TOML file (``deploy/engine.toml`` is an example).

Pure parsing, no torch: every mistake is a ``SettingsError`` naming the key at fault.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shunter.engine.api.deployments import MODEL_KEYS, SLO_KEYS
from shunter.engine.api.protocol import MAX_SEQUENCES
from shunter.engine.cliargs import byte_count
from shunter.engine.config import CAPACITY_SOURCES, POLICIES, RemapConfig, SloSpec
from shunter.engine.server.models import ModelArg, parse_model_arg

DEFAULT_KV_TOKENS = 65536
DEFAULT_GRACE_S = 30.0  # seconds shutdown waits for the requests in flight
TOP_KEYS = {
    "device",
    "hbm_budget",
    "host_budget",
    "kv_tokens",
    "policy",
    "remap",
    "prefix_caching",
    "async_scheduling",
    "enforce_eager",
    "capacity_order",
    "grace_s",
    "max_sequences_per_request",
    "step_target_ms",
    "slo_classes",
    "models",
}


class SettingsError(Exception):
    """Settings the engine cannot start with; the message is for the user."""


@dataclass(frozen=True)
class EngineSettings:
    """``kv_tokens`` sizes each model's KV (with ``hbm_budget``, the arena's bytes, only
    the host swap space's default); ``host_budget`` is the host swap space's bytes;
    ``grace_s`` is how long shutdown waits for requests in flight. With ``remap`` the
    engine lends idle models' weight layers to the KV cache (Oneiros), taking device
    memory in ``capacity_order``. ``step_target_s`` is the time a step should take
    (None: derived from the models' SLO classes, see ``serve.step_target_s``).
    ``prefix_caching`` shares the KV of prompts' common prefixes between requests of a
    model (on by default, as in vLLM); only between requests of one tenant (the
    gateway's tenant header) unless the model's ``share_prefixes``.
    ``async_scheduling`` plans each step while the previous one runs (off by default:
    a request that stops on a token costs one wasted entry in the next step).
    ``enforce_eager`` runs decode steps without CUDA graphs."""

    models: tuple[ModelArg, ...]
    device: str | None = None
    hbm_budget: int | None = None
    host_budget: int | None = None
    kv_tokens: int = DEFAULT_KV_TOKENS
    policy: str = "lvf+"
    remap: bool = False
    capacity_order: tuple[str, ...] = CAPACITY_SOURCES
    grace_s: float = DEFAULT_GRACE_S
    slo_classes: dict[str, SloSpec] = field(default_factory=dict)
    # The most sequences (prompts x n) one request may run: a request's sequences all
    # run at once, so without a bound one request could hold the engine for minutes.
    max_sequences_per_request: int = MAX_SEQUENCES
    step_target_s: float | None = None
    prefix_caching: bool = True
    async_scheduling: bool = False
    enforce_eager: bool = False


def load_settings(config: Path | None, model_flags: Sequence[str]) -> EngineSettings:
    """The settings of ``config`` (a TOML file) with the ``--model`` flags' models added."""
    data: dict[str, Any] = {}
    if config is not None:
        try:
            data = tomllib.loads(config.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise SettingsError(f"{config}: {e}") from None
    return settings_from_dict(data, str(config) if config else "settings", model_flags)


def settings_from_dict(
    data: dict[str, Any], where: str, model_flags: Sequence[str] = ()
) -> EngineSettings:
    """Settings from a parsed TOML or JSON object (``where`` names it in messages)."""
    _no_unknown(data, TOP_KEYS, where)
    slo_specs = data.get("slo_classes", {})
    if not isinstance(slo_specs, dict):
        raise SettingsError(f"{where}: slo_classes must be a table")
    slos = {name: _slo(name, spec, where) for name, spec in slo_specs.items()}
    model_specs = data.get("models", [])
    if not isinstance(model_specs, list):
        raise SettingsError(f"{where}: models must be a list")
    models = [_model(m, slos, f"{where}: models[{i}]") for i, m in enumerate(model_specs)]
    for flag in model_flags:
        try:
            models.append(parse_model_arg(flag))
        except ValueError as e:
            raise SettingsError(f"--model: {e}") from None
    if not models:
        raise SettingsError("no models: give --model NAME=DIR or a config with [[models]]")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise SettingsError(f"model names must be unique, got {names}")
    policy = data.get("policy", "lvf+")
    if policy not in POLICIES:
        raise SettingsError(f"{where}: policy must be one of {', '.join(POLICIES)}")
    remap = data.get("remap", False)
    if not isinstance(remap, bool):
        raise SettingsError(f"{where}: remap must be true or false")
    prefix_caching = data.get("prefix_caching", True)
    if not isinstance(prefix_caching, bool):
        raise SettingsError(f"{where}: prefix_caching must be true or false")
    async_scheduling = data.get("async_scheduling", False)
    if not isinstance(async_scheduling, bool):
        raise SettingsError(f"{where}: async_scheduling must be true or false")
    enforce_eager = data.get("enforce_eager", False)
    if not isinstance(enforce_eager, bool):
        raise SettingsError(f"{where}: enforce_eager must be true or false")
    order = data.get("capacity_order", list(CAPACITY_SOURCES))
    if not isinstance(order, list):
        raise SettingsError(f"{where}: capacity_order must be a list")
    try:
        RemapConfig(capacity_order=tuple(order))
    except ValueError as e:
        raise SettingsError(f"{where}: {e}") from None
    max_sequences = _typed(data, "max_sequences_per_request", int, where)
    if max_sequences is not None and max_sequences < 1:
        raise SettingsError(f"{where}: max_sequences_per_request must be at least 1")
    step_target_ms = _typed(data, "step_target_ms", (int, float), where)
    if step_target_ms is not None and not step_target_ms > 0:
        raise SettingsError(f"{where}: step_target_ms must be positive")
    kv_tokens = _typed(data, "kv_tokens", int, where)
    if kv_tokens is not None and kv_tokens < 1:
        raise SettingsError(f"{where}: kv_tokens must be at least 1")
    grace_s = _typed(data, "grace_s", (int, float), where)
    if grace_s is not None and not 0 <= grace_s < float("inf"):
        raise SettingsError(f"{where}: grace_s must be a number of seconds >= 0")
    return EngineSettings(
        models=tuple(models),
        device=_typed(data, "device", str, where),
        hbm_budget=_bytes(data, "hbm_budget", where),
        host_budget=_bytes(data, "host_budget", where),
        kv_tokens=DEFAULT_KV_TOKENS if kv_tokens is None else kv_tokens,
        policy=policy,
        remap=remap,
        capacity_order=tuple(order),
        grace_s=DEFAULT_GRACE_S if grace_s is None else float(grace_s),
        slo_classes=slos,
        max_sequences_per_request=max_sequences or MAX_SEQUENCES,
        step_target_s=None if step_target_ms is None else step_target_ms / 1000,
        prefix_caching=prefix_caching,
        async_scheduling=async_scheduling,
        enforce_eager=enforce_eager,
    )


def check_model_dirs(settings: EngineSettings) -> None:
    """Every model directory holds a config and a tokenizer."""
    for m in settings.models:
        for file in ("config.json", "tokenizer.json"):
            if not (m.path / file).is_file():
                raise SettingsError(f"model {m.name!r}: {m.path} has no {file}")


def _no_unknown(data: dict[str, Any], keys: Set[str], where: str) -> None:
    unknown = sorted(set(data) - keys)
    if unknown:
        raise SettingsError(f"{where}: unknown key {unknown[0]!r}; expected {sorted(keys)}")


def _typed(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = data.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise SettingsError(f"{where}: {key} has the wrong type ({value!r})")
    return value


def _bytes(data: dict[str, Any], key: str, where: str) -> int | None:
    """A byte count: an integer, or a string such as ``"40G"``."""
    value: int | str | None = _typed(data, key, (int, str), where)
    if not isinstance(value, str):
        return value
    try:
        return byte_count(value)
    except argparse.ArgumentTypeError as e:
        raise SettingsError(f"{where}: {key}: {e}") from None


def _slo(name: str, spec: Any, where: str) -> SloSpec:
    if not isinstance(spec, dict):
        raise SettingsError(f"{where}: slo_classes.{name} must be a table")
    _no_unknown(spec, SLO_KEYS, f"{where}: slo_classes.{name}")
    try:
        return SloSpec(
            name,
            ttft_s=float(spec.get("ttft_ms", 5000)) / 1000,
            tbt_s=float(spec.get("tbt_ms", 100)) / 1000,
            alpha=float(spec.get("alpha", 3.0)),
            beta_b=float(spec.get("beta_b", 0.0)),
            beta_f=float(spec.get("beta_f", 0.5)),
        )
    except (TypeError, ValueError) as e:
        raise SettingsError(f"{where}: slo_classes.{name}: {e}") from None


def _model(spec: Any, slos: dict[str, SloSpec], where: str) -> ModelArg:
    if not isinstance(spec, dict) or "name" not in spec or "path" not in spec:
        raise SettingsError(f"{where}: a model needs name and path")
    _no_unknown(spec, MODEL_KEYS, where)
    slo = spec.get("slo")
    if slo is not None and slo not in slos:
        raise SettingsError(f"{where}: unknown SLO class {slo!r}")
    share_prefixes = spec.get("share_prefixes", False)
    if not isinstance(share_prefixes, bool):
        raise SettingsError(f"{where}: share_prefixes must be true or false")
    try:
        return ModelArg(
            name=str(spec["name"]),
            path=Path(spec["path"]),
            sharing=spec.get("sharing", "spatial"),
            priority=int(spec.get("priority", 0)),
            slo=None if slo is None else slos[slo],
            kv_floor=_bytes(spec, "kv_floor", where),
            kv_ceiling=_bytes(spec, "kv_ceiling", where),
            max_context=_typed(spec, "max_context", int, where),
            share_prefixes=share_prefixes,
        )
    except (TypeError, ValueError) as e:
        raise SettingsError(f"{where}: {e}") from None
