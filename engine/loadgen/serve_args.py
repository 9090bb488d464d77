"""``shunter bench serve``'s parsed flags (``serve_cli``) as what a run needs: the target,
the workload, the rates and request count, and where each rate's ``--save-result``
document goes (``vllm_result``)."""

from __future__ import annotations

import argparse
import datetime
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shunter.engine.loadgen.client import Endpoint, Target
from shunter.engine.loadgen.runner import RateResult
from shunter.engine.loadgen.serve_cli import BACKENDS, ENDPOINTS, SAMPLING
from shunter.engine.loadgen.vllm_result import (
    DEFAULT_PERCENTILE_METRICS,
    DEFAULT_PERCENTILES,
    ResultOptions,
    result_document,
    result_filename,
)
from shunter.engine.workload.requests import WorkloadError
from shunter.engine.workload.sources import (
    LengthDist,
    PrefixRepetitionWorkload,
    SyntheticWorkload,
    TraceWorkload,
    Workload,
)

# vLLM's defaults: 1,000 prompts at an infinite rate; random prompts of 1,024 tokens
# and outputs of 128 (vllm/benchmarks/serve.py and datasets.py).
DEFAULT_NUM_PROMPTS = 1000
DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 128


class ServeArgsError(ValueError):
    """Flags that do not make a run; the message says which and why."""


@dataclass(frozen=True)
class ServeArgs:
    target: Target
    workload: Workload
    rates: list[float | None]
    num_requests: int | None
    options: ResultOptions
    ns: argparse.Namespace
    date: str

    @property
    def trace(self) -> bool:
        return isinstance(self.workload, TraceWorkload)

    @classmethod
    def of(cls, ns: argparse.Namespace, sample: Path) -> ServeArgs:
        try:
            target = _target(ns)
            workload = _workload(ns, sample)
            options = ResultOptions(
                tuple(ns.percentile_metrics or DEFAULT_PERCENTILE_METRICS),
                tuple(float(q) for q in ns.metric_percentiles or DEFAULT_PERCENTILES),
                {k: float(v) for k, v in ns.goodput} if ns.goodput else None,
                detailed=ns.save_detailed,
            )
        except (ValueError, WorkloadError) as exc:
            raise ServeArgsError(str(exc)) from None
        trace = isinstance(workload, TraceWorkload)
        rates: list[float | None] = list(ns.rps) if ns.rps else [None if trace else math.inf]
        num_requests = ns.num_requests
        if not trace and ns.duration is None and num_requests is None:
            num_requests = DEFAULT_NUM_PROMPTS
        if ns.duration is not None and any(r is not None and math.isinf(r) for r in rates):
            raise ServeArgsError("an infinite rate needs --num-prompts, not --duration")
        date = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        return cls(target, workload, rates, num_requests, options, ns, date)

    def save(self, result: RateResult, *, several: bool) -> Path:
        """Write ``result``'s document (``--save-result``/``--append-result``); its path."""
        ns, report = self.ns, result.report
        label = ns.label or ns.backend
        rate: Any = "inf" if math.isinf(report.request_rate) else report.request_rate
        header: dict[str, Any] = {
            "date": self.date,
            "endpoint_type": ns.backend,
            "backend": ns.backend,
            "label": ns.label,
            "model_id": self.target.model,
            "tokenizer_id": str(ns.tokenizer) if ns.tokenizer else None,
            "num_prompts": report.num_prompts,
            **dict(ns.metadata),
            "request_rate": rate,
            "burstiness": report.burstiness,
            "max_concurrency": report.max_concurrency,
        }
        doc = result_document(header, report.to_dict(), result.requests, self.options)
        name = result_filename(
            label, report.request_rate, report.max_concurrency, self.target.model, self.date
        )
        if ns.result_filename:
            name = ns.result_filename
            if several:
                stem, dot, suffix = name.rpartition(".")
                tag = f"-{float(report.request_rate)}qps"
                name = f"{stem}{tag}{dot}{suffix}" if dot else f"{name}{tag}"
        path = Path(name)
        if ns.result_dir:
            ns.result_dir.mkdir(parents=True, exist_ok=True)
            path = ns.result_dir / path
        with path.open("a+" if ns.append_result else "w", encoding="utf-8") as f:
            if ns.append_result and f.tell() != 0:
                f.write("\n")
            json.dump(doc, f)
        return path


def _target(ns: argparse.Namespace) -> Target:
    path = ENDPOINTS[ns.endpoint] if ns.endpoint else BACKENDS[ns.backend]
    endpoint: Endpoint = "chat" if path == "chat" else "completions"
    body: dict[str, Any] = {}
    for flag, _ in SAMPLING:
        value = getattr(ns, flag[2:].replace("-", "_"))
        if value is not None:
            body[flag[2:].replace("-", "_")] = value
    body.update(ns.extra_body or {})
    base_url = ns.base_url or f"http://{ns.host}:{ns.port}"
    return Target(
        base_url,
        ns.model,
        ns.api_key,
        endpoint,
        ignore_eos=ns.ignore_eos,
        extra_body=body,
        extra_headers=dict(ns.header),
    )


def _workload(ns: argparse.Namespace, sample: Path) -> Workload:
    from shunter.engine.workload.sharegpt import sharegpt_workload
    from shunter.engine.workload.tokens import token_counter
    from shunter.engine.workload.traces import trace_workload

    if ns.dataset is not None and (ns.dataset_name or ns.dataset_path):
        raise ServeArgsError("give --dataset or --dataset-name/--dataset-path, not both")
    if ns.dataset is not None:
        kind, _, text = ns.dataset.partition(":")
        path = Path(text) if text else None
    else:
        kind, path = ns.dataset_name or "sharegpt", ns.dataset_path
    count = token_counter(ns.tokenizer) if ns.tokenizer else None
    if kind == "sharegpt":
        return sharegpt_workload(path or sample, count)
    if kind in ("synthetic", "random") and path is None:
        return SyntheticWorkload(
            _length(ns.random_input_len, ns.input_len, DEFAULT_INPUT_LEN, ns.random_range_ratio),
            _length(ns.random_output_len, ns.output_len, DEFAULT_OUTPUT_LEN, ns.random_range_ratio),
            count,
        )
    if kind == "prefix_repetition" and path is None:
        return PrefixRepetitionWorkload(
            ns.prefix_repetition_prefix_len,
            ns.prefix_repetition_suffix_len,
            ns.prefix_repetition_num_prefixes,
            ns.prefix_repetition_output_len,
            count,
        )
    if kind == "trace" and path is not None:
        return trace_workload(path, count, seed=ns.seed)
    raise ServeArgsError(
        "the dataset must be --dataset-name sharegpt [--dataset-path PATH], random, "
        "prefix_repetition, or "
        "trace --dataset-path PATH (or --dataset sharegpt[:PATH], synthetic, trace:PATH): "
        f"{ns.dataset or kind!r}"
    )


def _length(exact: int | None, given: LengthDist | None, default: int, ratio: float) -> LengthDist:
    """``--random-*-len`` (else ``--*-len``, else ``default``) spread by vLLM's
    ``--random-range-ratio`` r: uniform over [len x (1 - r), len x (1 + r)]."""
    if not 0.0 <= ratio < 1.0:
        raise ServeArgsError(f"--random-range-ratio must be within [0, 1): {ratio}")
    if exact is None and given is not None:
        if given.kind != "constant" or ratio == 0.0:
            return given
        exact = given.low
    n = default if exact is None else exact
    if ratio == 0.0:
        return LengthDist("constant", n, n)
    return LengthDist("uniform", max(1, int(n * (1 - ratio))), max(1, int(n * (1 + ratio))))
