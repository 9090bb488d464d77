"""Executor benchmarks (``shunter bench executor``), host wall time on this machine.

(a) Throughput: output tokens/s of the engine (EngineCore, scheduler, paged attention
    reference, torch executor) against ``transformers``' ``generate`` on the same batch
    of equal-length prompts, greedy, every request producing exactly ``max_tokens``
    tokens; both timed after a warm-up, in the same run.
(b) Rotation cost: the wall time of a decode step of the same batch with B KV blocks
    swapped out and B swapped in, against the same step with no copies. Steps run back
    to back and the copies are waited for at the end, so on a GPU, where the copies
    overlap compute, the figure is what a step costs in steady state.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from shunter.engine.benchmarks.models import model_or_preset
from shunter.engine.exec.detok import token_bytes
from shunter.engine.exec.hf_config import eos_token_ids
from shunter.engine.exec.loader import load_model
from shunter.engine.exec.model import Transformer, kv_block_shape
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.serving import TorchEngine, model_specs
from shunter.engine.exec.sizing import BLOCK_TOKENS, KVNeed, serving_config
from shunter.engine.exec.torch_executor import ServedModel, TorchExecutor
from shunter.engine.exec.transfers import host_swap_space, make_transfers
from shunter.engine.loadgen.engine_process import random_prompts
from shunter.engine.plan import BatchEntry, BlockCopies, StepPlan

PRESET = "small-llama"
MODEL = "m"


def bench_executor(
    *,
    model_dir: Path | None = None,
    num_prompts: int = 16,
    prompt_tokens: int = 64,
    max_tokens: int = 32,
    swap_blocks: int = 64,
    threads: int | None = None,
    device: str = "cpu",
) -> Iterator[str]:
    """Run both benchmarks and yield the report's lines."""
    torch.set_num_threads(threads or os.cpu_count() or 1)
    dev = torch.device(device)
    with tempfile.TemporaryDirectory(prefix="shunter-bench-") as tmp:
        model_dir = yield from model_or_preset(tmp, model_dir, PRESET)
        prompts = random_prompts(num_prompts, prompt_tokens)
        yield (
            f"{model_dir.name} on {device}, {torch.get_num_threads()} threads: "
            f"{num_prompts} prompts x {prompt_tokens} tokens, {max_tokens} output tokens each"
        )
        yield from _throughput(model_dir, prompts, max_tokens, dev)
        yield from _rotation_cost(model_dir, prompts, max_tokens, swap_blocks, dev)


def _throughput(
    model_dir: Path,
    prompts: list[list[int]],
    max_tokens: int,
    device: torch.device,
    *,
    rounds: int = 3,
) -> Iterator[str]:
    """Both generators, alternated ``rounds`` times (a busy machine slows both alike);
    the medians compared."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    engine = _engine(model_dir, prompts, max_tokens, device)
    # transformers' generate is untyped: the model is Any here.
    hf: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    hf = hf.to(device).eval()
    _engine_generate(engine, prompts[:2], 2)  # warm-up
    _hf_generate(hf, prompts[:2], 2, device)
    ours_s, hf_s = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        ours = _engine_generate(engine, prompts, max_tokens)
        ours_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        theirs = _hf_generate(hf, prompts, max_tokens, device)
        hf_s.append(time.perf_counter() - t0)
    t_ours, t_hf = statistics.median(ours_s), statistics.median(hf_s)
    num_tokens = len(prompts) * max_tokens
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    yield f"(a) greedy generation, output tokens/s (median of {rounds} alternated runs)"
    yield f"    shunter engine          {num_tokens / t_ours:9.1f} tok/s  ({t_ours:.2f} s)"
    yield f"    transformers generate   {num_tokens / t_hf:9.1f} tok/s  ({t_hf:.2f} s)"
    yield f"    ratio engine/transformers  {t_hf / t_ours:.2f}"
    yield f"    identical outputs: {same} of {len(prompts)} requests"


def _engine(
    model_dir: Path, prompts: list[list[int]], max_tokens: int, device: torch.device
) -> TorchEngine:
    models = {MODEL: model_dir}
    needs = [KVNeed(f"#{i}", MODEL, len(p) + max_tokens) for i, p in enumerate(prompts)]
    return TorchEngine(models, serving_config(model_specs(models), needs), device=device)


def _engine_generate(
    engine: TorchEngine, prompts: list[list[int]], max_tokens: int
) -> list[list[int]]:
    # min_tokens bans EOS, as min_new_tokens does in transformers: equal lengths.
    params = SamplingParams(temperature=0, max_tokens=max_tokens, min_tokens=max_tokens)
    ids = [engine.add_request(MODEL, p, params) for p in prompts]
    done = engine.run()
    return [done[i].output_ids for i in ids]


def _hf_generate(
    model: Any, prompts: list[list[int]], max_tokens: int, device: torch.device
) -> list[list[int]]:
    inputs = torch.tensor(prompts, device=device)
    with torch.inference_mode():
        out = model.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return [row[inputs.shape[1] :] for row in out.tolist()]


def _rotation_cost(
    model_dir: Path,
    prompts: list[list[int]],
    max_tokens: int,
    swap_blocks: int,
    device: torch.device,
    *,
    steps: int = 10,
    rounds: int = 3,
) -> Iterator[str]:
    """Decode steps of the batch at full context, with and without ``swap_blocks``
    blocks copied each way, through the executor and the device's transfer engine."""
    loaded = load_model(model_dir, device=device)
    model = Transformer(loaded.arch, loaded.weights)
    context = len(prompts[0]) + max_tokens
    per_seq = -(-context // BLOCK_TOKENS)
    seq_blocks = len(prompts) * per_seq
    shape = kv_block_shape(loaded.arch, BLOCK_TOKENS)
    kv = torch.zeros((seq_blocks + 2 * swap_blocks, *shape), dtype=loaded.dtype, device=device)
    block_bytes = kv[0].nbytes
    host = host_swap_space(
        2 * swap_blocks * block_bytes, shape, loaded.dtype, pin=device.type == "cuda"
    )
    transfers = make_transfers({MODEL: kv}, {MODEL: host})
    executor = TorchExecutor(transfers)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    served = ServedModel(model, kv, BLOCK_TOKENS, eos_token_ids(model_dir), token_bytes(tokenizer))
    executor.add_model(MODEL, served)
    tokens, tables = {}, {}
    for i, prompt in enumerate(prompts):
        rid = f"r{i}"
        tokens[rid] = (prompt + prompt)[context - 1 : context]  # the last of a full context
        tables[rid] = list(range(i * per_seq, (i + 1) * per_seq))
        # The same step repeats: nothing may end the request.
        endless = SamplingParams(temperature=0, max_tokens=1 << 20, ignore_eos=True)
        executor.add_request(rid, MODEL, endless)
    batch = [BatchEntry(rid, MODEL, 1, context - 1, False, True) for rid in tokens]
    b = swap_blocks
    out = BlockCopies(list(range(seq_blocks, seq_blocks + b)), list(range(b)))
    into = BlockCopies(list(range(seq_blocks + b, seq_blocks + 2 * b)), list(range(b, 2 * b)))
    step = 0

    def run(with_copies: bool) -> float:
        nonlocal step
        t0 = time.perf_counter()
        for _ in range(steps):
            plan = StepPlan(step=step, batch=batch, block_tables=tables, token_ids=tokens)
            if with_copies:
                plan.swap_out, plan.swap_in = {MODEL: out}, {MODEL: into}
            transfers.submit(plan)
            executor.execute(plan)
            transfers.poll(0.0)
            step += 1
        transfers.synchronize()
        return (time.perf_counter() - t0) / steps

    run(True)  # warm-up
    none, swapped = [], []
    for _ in range(rounds):
        none.append(run(False))
        swapped.append(run(True))
    t_none, t_swapped = statistics.median(none), statistics.median(swapped)
    mib = swap_blocks * block_bytes / 2**20
    yield (
        f"(b) KV rotation: decode step of {len(prompts)} requests at {context} tokens, "
        f"B = {swap_blocks} blocks ({mib:.1f} MiB) each way"
    )
    yield f"    step, no copies        {t_none * 1e3:9.2f} ms"
    yield f"    step, B out + B in     {t_swapped * 1e3:9.2f} ms"
    yield f"    ratio with/without        {t_swapped / t_none:.2f}"
    extra = t_swapped - t_none
    if extra > 0:
        yield f"    copies add {extra * 1e3:.2f} ms: {2 * mib / 1024 / extra:.2f} GiB/s both ways"
