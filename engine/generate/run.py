"""``shunter generate``: EngineCore with the torch executor, offline, over model directories.

Requests come from one prompt (run on every model) or a JSON Lines file, and all run
concurrently through the scheduler. Without ``--hbm-budget`` the arena holds every
request at full length; with it, the arena is exactly that many bytes, so requests
compete for KV blocks and rotate. Bad input raises ``ServeError`` with a message for
the user, before any weights load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from shunter.engine.config import ModelSpec
from shunter.engine.errors import ServeError
from shunter.engine.exec.detok import token_speller
from shunter.engine.exec.forced_remap import forced_layers
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.serving import NoProgressError, TorchEngine, model_specs
from shunter.engine.exec.sizing import KVNeed, serving_config
from shunter.engine.generate.inputs import (
    GenerateRequest,
    check_model_dirs,
    parse_model_arg,
    prompt_requests,
    read_requests,
)


@dataclass(frozen=True)
class GenerateOptions:
    """Everything of a ``shunter generate`` run but the requests."""

    models: Mapping[str, Path]
    params: SamplingParams  # max_tokens is each request's own
    device: torch.device
    hbm_budget: int | None = None
    force_rotation: bool = False
    remap: bool = False
    force_remap: int | None = None
    force_remap_inactive: bool = False
    check_integrity: bool = False
    prefix_caching: bool = False
    async_scheduling: bool = False
    enforce_eager: bool = False


@dataclass
class GenerateResult:
    """One object per request, in input order, the run's summary, and what the run
    could not do as asked (``warnings``, for the user)."""

    outputs: list[dict[str, Any]]
    summary: dict[str, int]
    warnings: list[str] = field(default_factory=list)


def run_generate(requests: Sequence[GenerateRequest], options: GenerateOptions) -> GenerateResult:
    """Serve ``requests`` concurrently and return their outputs in input order."""
    specs = _model_specs(options.models)
    by_name = {spec.name: spec for spec in specs}
    tokenizers = _tokenizers(options.models)
    prompts = [_prompt_ids(r, by_name[r.model], tokenizers[r.model]) for r in requests]
    config = serving_config(
        specs,
        [
            KVNeed(r.where, r.model, len(p) + r.max_tokens)
            for r, p in zip(requests, prompts, strict=True)
        ],
        hbm_budget=options.hbm_budget,
        force_rotation=options.force_rotation,
        remap=options.remap or options.force_remap is not None,
        check_integrity=options.check_integrity,
        prefix_caching=options.prefix_caching,
        async_scheduling=options.async_scheduling,
        enforce_eager=options.enforce_eager,
    )
    engine = TorchEngine(
        options.models,
        config,
        device=options.device,
        force_rotation=options.force_rotation,
        force_remap=options.force_remap,
        force_remap_inactive=options.force_remap_inactive,
    )
    ids = [
        engine.add_request(
            r.model, prompt, dataclasses.replace(options.params, max_tokens=r.max_tokens)
        )
        for r, prompt in zip(requests, prompts, strict=True)
    ]
    try:
        done = engine.run()
    except NoProgressError as e:
        raise ServeError(f"the engine stalled: {e}") from None
    outputs = [
        {
            "model": done[i].model,
            "prompt_ids": done[i].prompt_ids,
            "output_ids": done[i].output_ids,
            "text": done[i].text,
        }
        for i in ids
    ]
    totals = engine.totals
    summary = {
        "rotations": totals.rotations,
        "blocks_swapped_out": totals.blocks_swapped_out,
        "blocks_swapped_in": totals.blocks_swapped_in,
        "remapped_layers_max": totals.remapped_layers_max,
        "layers_streamed": totals.layers_streamed,
        "layers_restored": totals.layers_restored,
        "steps": totals.steps,
        "prefix_cache_queries": sum(engine.core.memory.prefix_stats.queries.values()),
        "prefix_cache_hits": sum(engine.core.memory.prefix_stats.hits.values()),
        "prefix_cache_host_hits": sum(engine.core.memory.prefix_stats.host_hits.values()),
    }
    return GenerateResult(outputs, summary, _remap_warnings(specs, options.force_remap))


def _remap_warnings(specs: Sequence[ModelSpec], force_remap: int | None) -> list[str]:
    """One line per model that forced remapping asks for layers it cannot lend."""
    if not force_remap:
        return []
    return [
        f"--force-remap: model {spec.name!r} lends no layer: it has {spec.num_layers} "
        f"layers and a model lends at most its layers less 2"
        for spec in specs
        if forced_layers(spec.num_layers, force_remap) == 0
    ]


def _model_specs(models: Mapping[str, Path]) -> tuple[ModelSpec, ...]:
    """``model_specs(models)``, a config that cannot be served named in the error."""
    specs: list[ModelSpec] = []
    for name, path in models.items():
        try:
            specs += model_specs({name: path})
        except (ValueError, KeyError, TypeError) as e:
            raise ServeError(f"model {name!r}: {path}/config.json: {e}") from None
    return tuple(specs)


def _tokenizers(models: Mapping[str, Path]) -> dict[str, Tokenizer]:
    """Each model's tokenizer, checked before any weights load: one that cannot be read,
    or whose tokens the engine cannot turn into text, is a ServeError."""
    tokenizers = {}
    for name, path in models.items():
        file = path / "tokenizer.json"
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as e:  # the tokenizers library raises plain Exceptions
            first_line = (str(e).splitlines() or [type(e).__name__])[0]
            raise ServeError(f"model {name!r}: {file} cannot be read: {first_line}") from None
        try:
            token_speller(tokenizer)
        except ValueError as e:
            raise ServeError(f"model {name!r}: {file}: {e}") from None
        tokenizers[name] = tokenizer
    return tokenizers


def _prompt_ids(request: GenerateRequest, spec: ModelSpec, tokenizer: Tokenizer) -> list[int]:
    if request.prompt_ids is not None:
        ids = list(request.prompt_ids)
    else:
        assert request.prompt is not None
        ids = tokenizer.encode(request.prompt).ids
    if not ids:
        raise ServeError(f"request {request.where}: the prompt has no tokens")
    if max(ids) >= spec.vocab_size:
        raise ServeError(
            f"request {request.where}: token id {max(ids)} is outside the vocabulary of "
            f"model {spec.name!r} ({spec.vocab_size} tokens)"
        )
    if len(ids) + request.max_tokens > spec.max_context:
        raise ServeError(
            f"request {request.where}: {len(ids)} prompt tokens plus max_tokens "
            f"{request.max_tokens} exceed the context of model {spec.name!r} "
            f"({spec.max_context} tokens)"
        )
    return ids


def format_text(result: GenerateResult) -> list[str]:
    """Human-readable lines: each request's tokens and text, then the summary."""
    lines = []
    for i, out in enumerate(result.outputs):
        lines.append(
            f"[{i}] {out['model']}: {len(out['prompt_ids'])} prompt tokens, "
            f"{len(out['output_ids'])} output tokens"
        )
        lines.append(f"    output_ids: {' '.join(map(str, out['output_ids']))}")
        lines.append(f"    text: {out['text']!r}")
    lines.append("summary: " + ", ".join(f"{k} {v}" for k, v in result.summary.items()))
    return lines


def format_json(result: GenerateResult) -> list[str]:
    """One JSON object per request, in input order, then ``{"summary": ...}`` (the
    counters and the list of warnings)."""
    lines = [json.dumps(out, ensure_ascii=False) for out in result.outputs]
    lines.append(json.dumps({"summary": {**result.summary, "warnings": result.warnings}}))
    return lines


def available_device(name: str | None) -> torch.device:
    """``--device``: CUDA when available unless named; refuses CUDA without one."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ServeError("--device cuda: no CUDA device is available")
    return torch.device(name)


def generate_from_args(ns: argparse.Namespace, *, check_integrity: bool = False) -> GenerateResult:
    """Run ``shunter generate`` for its parsed arguments (``generate/cli.py``)."""
    models = check_model_dirs([parse_model_arg(v) for v in ns.model])
    if ns.greedy and ns.seed is not None:
        raise ServeError("--seed applies to sampling: use it with --temperature, not --greedy")
    if ns.requests is not None:
        requests = read_requests(ns.requests, list(models), ns.max_tokens)
    else:
        requests = prompt_requests(
            list(models), text=ns.prompt, ids=ns.prompt_ids, max_tokens=ns.max_tokens
        )
    if ns.force_remap_inactive and ns.force_remap is None:
        raise ServeError("--force-remap-inactive applies to --force-remap N")
    params = SamplingParams(temperature=0.0 if ns.greedy else ns.temperature, seed=ns.seed)
    options = GenerateOptions(
        models=models,
        params=params,
        device=available_device(ns.device),
        hbm_budget=ns.hbm_budget,
        force_rotation=ns.force_rotation,
        remap=ns.remap,
        force_remap=ns.force_remap,
        force_remap_inactive=ns.force_remap_inactive,
        check_integrity=check_integrity,
        prefix_caching=ns.enable_prefix_caching,
        async_scheduling=ns.async_scheduling,
        enforce_eager=ns.enforce_eager,
    )
    return run_generate(requests, options)
