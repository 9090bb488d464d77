"""Copies between two CPU tensors on the calling thread alone.

On a CPU device the engine's host-to-device copies (a layer into its frame or slot, KV
blocks between the arena and the host tier) stand in for a GPU's copy engines, which
take no compute cores. ``Tensor.copy_`` and indexed assignment split a large copy over
torch's intra-op threads and wait for all of them: on a host whose cores are busy with
other processes that wait is a scheduler time slice per copy. Measured on a 2-core host
with two busy loops beside it, a 184 KB layer copy took 8-16 ms with ``copy_`` (the
fastest of five) and 5-7 us as one ``memcpy`` on the calling thread; unloaded, 5 us
either way after the thread pool's first start (14 ms). A copy that slow makes T_T
look larger than a whole forward pass, so the remapping controller lends no layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def copy_on_this_thread(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for CPU tensors of one shape and dtype, as one memcpy on this
    thread when both are contiguous (else ``copy_`` itself)."""
    if dst.device.type != "cpu" or src.device.type != "cpu" or not _same_bytes(dst, src):
        dst.copy_(src)
        return
    np.copyto(_bytes(dst), _bytes(src))


def copy_rows_on_this_thread(
    dst: torch.Tensor, dst_rows: Sequence[int], src: torch.Tensor, src_rows: Sequence[int]
) -> None:
    """``dst[dst_rows] = src[src_rows]`` for contiguous CPU tensors of the same row
    shape and dtype (KV blocks: a row is a block), on this thread."""
    if len(dst_rows) != len(src_rows):
        raise ValueError(f"{len(dst_rows)} destination rows for {len(src_rows)} source rows")
    if dst.device.type != "cpu" or src.device.type != "cpu" or not _same_rows(dst, src):
        dst[list(dst_rows)] = src[list(src_rows)].to(dst.device)
        return
    d, s = _rows(dst), _rows(src)
    d[np.asarray(dst_rows, dtype=np.int64)] = s[np.asarray(src_rows, dtype=np.int64)]


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.is_contiguous() and b.is_contiguous()


def _same_rows(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape[1:] == b.shape[1:]
        and a.dtype == b.dtype
        and a.is_contiguous()
        and b.is_contiguous()
    )


def _bytes(t: torch.Tensor) -> np.ndarray:
    """A contiguous tensor's bytes as a flat uint8 array (numpy has no bfloat16)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def _rows(t: torch.Tensor) -> np.ndarray:
    """A contiguous tensor's bytes as a uint8 array of one row per first index."""
    return t.reshape(t.shape[0], -1).view(torch.uint8).numpy()
