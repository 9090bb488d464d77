"""Kernel benchmarks (``shunter bench kernels``): each Triton kernel against its torch
reference, in the same run, on one layer of a ``llama-3-8b``-shaped cache.

Figures: median time per call (``triton.testing.do_bench``), the bytes a call must
move (K/V read, queries, outputs; blocks read and written) per second, attention
prefill's TFLOP/s, and the bandwidth as a share of the device's measured peak (a large
device-to-device copy, read plus written bytes, timed in the same run).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import torch

from shunter.kernels import kv_blocks
from shunter.kernels import paged_attention as reference
from shunter.kernels.paged_attention import PagedAttentionPlan, plan_paged_attention

Timer = Callable[[Callable[[], object]], float]  # seconds per call


@dataclass(frozen=True)
class CacheShape:
    """A model's attention shapes and its block-first cache's."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    block_tokens: int
    dtype: torch.dtype

    @property
    def token_kv_bytes(self) -> int:
        """K and V of one token in one layer."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype.itemsize


LLAMA_3_8B = CacheShape(
    num_heads=32, num_kv_heads=8, head_dim=128, num_layers=32, block_tokens=16, dtype=torch.bfloat16
)
LAYER = 1


@dataclass(frozen=True)
class Workload:
    """What ``bench_kernels`` times: decode batches at ``context``, one long decode (split-K),
    prefill chunks as (chunk tokens, cached prefix), a write_kv batch, swapped blocks."""

    decode_batches: tuple[int, ...] = (1, 16, 64, 256)
    context: int = 1024
    long_context: int = 32768
    prefills: tuple[tuple[int, int], ...] = ((2048, 0), (512, 4096))
    write_tokens: int = 256
    swap_blocks: int = 64
    peak_copy_bytes: int = 1 << 30


def cuda_timer(fn: Callable[[], object]) -> float:
    """Median seconds per call of ``fn`` on the current CUDA device."""
    import triton.testing  # type: ignore[import-untyped]

    return float(triton.testing.do_bench(fn, return_mode="median")) / 1e3


def bench_kernels(
    *,
    shape: CacheShape = LLAMA_3_8B,
    work: Workload = Workload(),
    device: torch.device,
    timer: Timer = cuda_timer,
) -> Iterator[str]:
    """Time every kernel against its reference on ``device`` and yield the report's lines."""
    from shunter.kernels import triton_kv_blocks, triton_paged_attention

    gen = torch.Generator().manual_seed(0)
    src = torch.empty(work.peak_copy_bytes, dtype=torch.uint8, device=device)
    peak = 2 * src.numel() / timer(partial(torch.empty_like(src).copy_, src))
    del src
    yield (
        f"device {_device_name(device)}; {shape}; copy peak {peak / 1e9:.0f} GB/s "
        "(device-to-device copy, bytes read + written)"
    )

    def row(name: str, nbytes: int, tri: Callable[[], object], ref: Callable[[], object]) -> str:
        t_tri, t_ref = timer(tri), timer(ref)
        return (
            f"{name}: triton {t_tri * 1e3:.3f} ms {nbytes / t_tri / 1e9:.0f} GB/s "
            f"({nbytes / t_tri / peak:.0%} of peak), reference {t_ref * 1e3:.3f} ms "
            f"{nbytes / t_ref / 1e9:.0f} GB/s: triton {t_ref / t_tri:.1f}x"
        )

    decodes = [(b, work.context) for b in work.decode_batches] + [(1, work.long_context)]
    for batch, context in decodes:
        plan, cache = _paged(shape, [(1, context)] * batch, device, gen)
        query = _randn((batch, shape.num_heads, shape.head_dim), shape.dtype, device, gen)
        args = (query, cache, LAYER, plan, shape.head_dim**-0.5)
        nbytes = batch * context * shape.token_kv_bytes + 2 * query.numel() * query.itemsize
        yield row(
            f"decode    batch {batch:>4} context {context:>6}",
            nbytes,
            partial(triton_paged_attention.paged_attention, *args),
            partial(reference.paged_attention, *args),
        )
        del plan, cache, query, args

    for chunk, prefix in work.prefills:
        plan, cache = _paged(shape, [(chunk, prefix + chunk)], device, gen)
        query = _randn((chunk, shape.num_heads, shape.head_dim), shape.dtype, device, gen)
        args = (query, cache, LAYER, plan, shape.head_dim**-0.5)
        # Two products of head_dim per visible (query, key) pair and head.
        pairs = chunk * prefix + chunk * (chunk + 1) // 2
        flops = 4 * shape.num_heads * shape.head_dim * pairs
        t_tri = timer(partial(triton_paged_attention.paged_attention, *args))
        t_ref = timer(partial(reference.paged_attention, *args))
        yield (
            f"prefill   chunk {chunk:>4} prefix {prefix:>6}: triton {t_tri * 1e3:.3f} ms "
            f"{flops / t_tri / 1e12:.1f} TFLOP/s, reference {t_ref * 1e3:.3f} ms "
            f"{flops / t_ref / 1e12:.1f} TFLOP/s: triton {t_ref / t_tri:.1f}x"
        )
        del plan, cache, query, args

    tokens = work.write_tokens
    # One block per token: write_kv touches only the new tokens' slots.
    plan, cache = _paged(shape, [(1, 1)] * tokens, device, gen)
    kv_shape = (tokens, shape.num_kv_heads, shape.head_dim)
    key, value = (_randn(kv_shape, shape.dtype, device, gen) for _ in range(2))
    write = (cache, LAYER, key, value, plan)
    yield row(
        f"write_kv  tokens {tokens:>4}",
        2 * tokens * shape.token_kv_bytes,  # read from K/V, written to the cache
        partial(triton_paged_attention.write_kv, *write),
        partial(reference.write_kv, *write),
    )
    del plan, cache, key, value, write

    block_shape = (shape.num_layers, 2, shape.block_tokens, shape.num_kv_heads, shape.head_dim)
    blocks = 4 * work.swap_blocks
    kv = _randn((blocks, *block_shape), shape.dtype, device, gen)
    ids = torch.randperm(blocks, generator=gen)[: work.swap_blocks].to(device)
    staging = torch.empty(work.swap_blocks, *block_shape, dtype=shape.dtype, device=device)
    moved = 2 * staging.numel() * staging.itemsize
    block_mib = staging[0].numel() * staging.itemsize / 2**20
    for verb, tri_fn, ref_fn in (
        ("gather ", triton_kv_blocks.gather_blocks, kv_blocks.gather_blocks),
        ("scatter", triton_kv_blocks.scatter_blocks, kv_blocks.scatter_blocks),
    ):
        yield row(
            f"{verb}   {work.swap_blocks} blocks of {block_mib:g} MiB",
            moved,
            partial(tri_fn, kv, ids, staging),
            partial(ref_fn, kv, ids, staging),
        )


def _paged(
    shape: CacheShape, batch: list[tuple[int, int]], device: torch.device, gen: torch.Generator
) -> tuple[PagedAttentionPlan, torch.Tensor]:
    """A plan for ``(new tokens, context)`` sequences over a random cache of just enough
    blocks, handed out in shuffled order."""
    need = [math.ceil(ctx / shape.block_tokens) for _, ctx in batch]
    order = torch.randperm(sum(need), generator=gen).tolist()
    starts = [0, *itertools.accumulate(need)]
    tables = [order[starts[s] : starts[s + 1]] for s in range(len(batch))]
    block_shape = (shape.num_layers, 2, shape.block_tokens, shape.num_kv_heads, shape.head_dim)
    cache = _randn((sum(need), *block_shape), shape.dtype, device, gen)
    plan = plan_paged_attention(
        query_lens=[q for q, _ in batch],
        context_lens=[c for _, c in batch],
        block_tables=tables,
        block_tokens=shape.block_tokens,
        device=device,
    )
    return plan, cache


def _randn(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> torch.Tensor:
    # Generated on the device: a host tensor of tens of GiB would take longer than the run.
    seed = int(torch.randint(2**31, (1,), generator=gen))
    device_gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=device_gen, device=device, dtype=dtype)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
