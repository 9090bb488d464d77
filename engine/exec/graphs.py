"""Decode passes replayed from CUDA graphs, one graph per batch-size bucket.

A decode step of n requests runs as the graph of the smallest bucket >= n. The graph
reads every input from static device buffers (tokens, positions, KV slots, context
lengths, block tables), filled before each replay, and writes its logits to a static
output; rows past n are padding: token 0 at position 0, a context of one position, and
a KV slot of block -1 that the write kernels skip, so padding writes nothing and its
logits are never read. A graph stays valid while the buffers' and the weights'
addresses do:

- rotation and swaps change block tables and the contents of blocks, both inputs;
- a model's layers are read from its weight frames in the arena, and remapping moves
  them: a layout (the frame of every layer) has its own graphs, captured when a step
  first needs one (the home layout's at start), the ``MAX_LAYOUTS`` most recent kept.
  A step that streams a lent layer through a slot runs eager.

Prefill chunks, batches larger than the largest bucket and contexts longer than
``max_context`` run eager too, as do mixtures of experts (their routing picks experts
on the host) and models whose kernels are not Triton's. ``StaticDecode`` works on any
device; only :meth:`StaticDecode.capture` needs CUDA. Without it every call runs the
same static pass eagerly, which is how the padding and the buffers are tested on a CPU.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from shunter.engine.exec.batch import ForwardBatch, SequenceChunk
from shunter.engine.exec.model import ResidentLayers, Transformer
from shunter.engine.exec.slots import WeightFrames
from shunter.kernels.paged_attention import static_decode_plan

log = logging.getLogger(__name__)

# vLLM's default capture sizes: 1, 2, 4, then every multiple of 8 up to 512, as far as
# the largest batch the scheduler runs (vllm/config.py, CompilationConfig
# ``cudagraph_capture_sizes`` and ``max_num_seqs``).
MAX_GRAPH_BATCH = 512
# vLLM's ``max_seq_len_to_capture`` default (vllm/config.py, ModelConfig): longer
# contexts run eager. It bounds the split-K grid every replay launches and its partial
# results (batch x heads x partitions x head_dim floats: 64 MiB at batch 256 for
# llama-3-8b shapes).
MAX_GRAPH_CONTEXT = 8192
# Layouts whose graphs are kept. Oneiros lends and restores a few layers at a time, so a
# model moves among few layouts; a graph set per layout costs host memory and one
# capture (a pass's time) when first needed.
MAX_LAYOUTS = 4

# The rows of the small inputs' buffer, each ``[max_batch]``.
_IDS, _POSITIONS, _SLOT_BLOCKS, _SLOT_OFFSETS, _CONTEXT = range(5)


def graph_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """The buckets for batches of up to ``max_batch`` (at most ``MAX_GRAPH_BATCH``)."""
    top = min(max_batch, MAX_GRAPH_BATCH)
    if top < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = [b for b in (1, 2, 4) if b <= top] + list(range(8, top + 1, 8))
    if sizes[-1] < top:
        sizes.append(-(-top // 8) * 8)  # the last bucket covers the largest batch
    return tuple(sizes)


def graphs_apply(model: Transformer) -> bool:
    """Whether a model's decode can be captured: dense MLPs (a mixture's routing reads
    the chosen experts on the host)."""
    return model.arch.num_experts == 0


@dataclass(frozen=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # its output


class StaticDecode:
    """One model's decode steps on static buffers, replayed from CUDA graphs once
    captured.

    ``frames`` (a model in the arena) are where its layers are read from; each pass
    reads the layout they have then. ``max_context`` bounds the contexts a static pass
    attends to.
    """

    def __init__(
        self,
        model: Transformer,
        kv_cache: torch.Tensor,
        block_tokens: int,
        *,
        max_batch: int,
        frames: WeightFrames | None = None,
        max_context: int = MAX_GRAPH_CONTEXT,
    ) -> None:
        if not graphs_apply(model):
            raise ValueError(f"{model.arch.family} routes experts on the host: no static pass")
        self.model = model
        self.kv_cache = kv_cache
        self.block_tokens = block_tokens
        self.frames = frames
        self.sizes = graph_batch_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        self.max_blocks = -(-min(max_context, model.arch.max_position_embeddings) // block_tokens)
        self.max_context = self.max_blocks * block_tokens
        device = model.device
        pinned = device.type == "cuda"
        # Two host buffers (page-locked on CUDA), each copied to its device twin.
        self.host_small = torch.zeros((5, self.max_batch), dtype=torch.int32, pin_memory=pinned)
        self.host_tables = torch.zeros(
            (self.max_batch, self.max_blocks), dtype=torch.int32, pin_memory=pinned
        )
        self.small = torch.zeros_like(self.host_small, device=device)
        self.tables = torch.zeros_like(self.host_tables, device=device)
        self.batches = {size: self._batch(size) for size in self.sizes}
        self.captured = False  # graphs from now on
        self._first: _Graph | None = None  # whose memory pool every graph shares
        self._graphs: OrderedDict[tuple[int, ...], dict[int, _Graph]] = OrderedDict()
        self.num_passes = 0  # static passes run, replayed or eager
        self.num_replays = 0
        self.num_captures = 0

    def _layout(self) -> tuple[int, ...]:
        """The frame each layer is read from now (none for a model outside the arena)."""
        if self.frames is None:
            return ()
        return tuple(self.frames.frame_of[i] for i in range(self.frames.num_layers))

    def _layers(self, layout: tuple[int, ...]) -> ResidentLayers:
        if self.frames is None:
            return ResidentLayers(self.model.weights.layers)
        views = self.frames.views
        return ResidentLayers([views[f] for f in layout])

    def _batch(self, size: int) -> ForwardBatch:
        small = self.small[:, :size]
        plan = static_decode_plan(
            num_seqs=size,
            max_blocks=self.max_blocks,
            block_tokens=self.block_tokens,
            slot_blocks=small[_SLOT_BLOCKS],
            slot_offsets=small[_SLOT_OFFSETS],
            context_lens=small[_CONTEXT],
            block_tables=self.tables[:size],
            sliding_window=self.model.arch.sliding_window,
        )
        return ForwardBatch(
            input_ids=small[_IDS],
            positions=small[_POSITIONS],
            attention=plan,
            sample_index=torch.arange(size, device=self.model.device),
        )

    def bucket(self, num_seqs: int) -> int | None:
        """The smallest bucket that holds ``num_seqs`` decodes, or None."""
        for size in self.sizes:
            if size >= num_seqs:
                return size
        return None

    def fits(self, chunks: Sequence[SequenceChunk], streams: bool) -> bool:
        """Whether a static pass can run this step: decodes only, each sampled and its
        table holding its token, no more than the largest bucket, contexts within
        ``max_context``, and no layer streamed (every layer in a frame)."""
        if not chunks or len(chunks) > self.max_batch or streams:
            return False
        bt = self.block_tokens
        return all(
            len(c.token_ids) == 1
            and c.samples
            and c.start < self.max_context
            and c.start // bt < len(c.block_table)  # else the eager pass says what is wrong
            for c in chunks
        )

    def capture(self) -> None:
        """Capture every bucket's graph for the layout of now (largest first, one memory
        pool) after a warm-up pass each that compiles the kernels; later layouts are
        captured as steps need them. Needs CUDA; the passes write no KV."""
        device = self.model.device
        if device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        self._fill([], self.max_batch)
        layout = self._layout()
        side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for size in self.sizes:
                self._forward(size, layout)
        torch.cuda.current_stream(device).wait_stream(side)
        for size in reversed(self.sizes):
            self._graph(size, layout)
        torch.cuda.synchronize(device)
        self.captured = True

    def _forward(self, size: int, layout: tuple[int, ...]) -> torch.Tensor:
        return self.model.forward(self.batches[size], self.kv_cache, self._layers(layout))

    def _graph(self, size: int, layout: tuple[int, ...]) -> _Graph:
        """The graph of ``size`` decodes in ``layout``, captured if it is new."""
        graphs = self._graphs.get(layout)
        if graphs is None:
            graphs = self._graphs[layout] = {}
            while len(self._graphs) > MAX_LAYOUTS:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(layout)
        found = graphs.get(size)
        if found is None:
            graph = torch.cuda.CUDAGraph()
            pool = None if self._first is None else self._first.graph.pool()
            # thread_local: the engine's other threads may use CUDA meanwhile.
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                logits = self._forward(size, layout)
            found = graphs[size] = _Graph(graph, logits)
            self._first = self._first or found
            self.num_captures += 1
        return found

    def run(self, chunks: Sequence[SequenceChunk]) -> torch.Tensor:
        """Logits ``[len(chunks), vocab]`` of a step that :meth:`fits`: the graph of its
        bucket and layout replayed, or, before :meth:`capture`, the static pass run
        eagerly. The logits are the graph's output, valid until the next call."""
        size = self.bucket(len(chunks))
        assert size is not None, "a step that does not fit"
        self._fill(chunks, size)
        self.num_passes += 1
        layout = self._layout()
        if not self.captured:
            return self._forward(size, layout)[: len(chunks)]
        found = self._graph(size, layout)
        found.graph.replay()
        self.num_replays += 1
        return found.logits[: len(chunks)]

    def _fill(self, chunks: Sequence[SequenceChunk], size: int) -> None:
        """Write the step's inputs, padding to ``size`` rows, into the device buffers."""
        n, bt = len(chunks), self.block_tokens
        small = self.host_small
        width = max((len(c.block_table) for c in chunks), default=0)
        width = min(width, self.max_blocks)
        if n:
            rows = [
                [
                    c.token_ids[0],
                    c.start,
                    c.block_table[c.start // bt],
                    c.start % bt,
                    c.start + 1,
                ]
                for c in chunks
            ]
            small[:, :n] = torch.tensor(rows, dtype=torch.int32).T
            tables = [
                list(c.block_table[:width]) + [0] * (width - len(c.block_table)) for c in chunks
            ]
            self.host_tables[:n, :width] = torch.tensor(tables, dtype=torch.int32)
        # Padding rows: token 0 at position 0, context 1, no KV written; their table
        # rows keep whatever block ids they held (read, never used).
        small[:, n:size] = 0
        small[_SLOT_BLOCKS, n:size] = -1
        small[_CONTEXT, n:size] = 1
        non_blocking = self.host_small.is_pinned()
        self.small[:, :size].copy_(small[:, :size], non_blocking=non_blocking)
        if n:
            self.tables[:n, :width].copy_(self.host_tables[:n, :width], non_blocking=non_blocking)


def capture_or_eager(static: StaticDecode, model_name: str) -> StaticDecode | None:
    """Capture ``static``'s graphs and log what it took, as vLLM does at start; on a
    failure say why and return None (the model decodes eagerly)."""
    t0 = time.perf_counter()
    try:
        static.capture()
    except RuntimeError as exc:  # a kernel or allocation the capture does not allow
        log.warning("%s: CUDA graphs not captured, decode runs eager: %s", model_name, exc)
        return None
    log.info(
        "%s: captured %d CUDA graphs (decode batches up to %d, contexts up to %d) in %.1f s",
        model_name,
        static.num_captures,
        static.max_batch,
        static.max_context,
        time.perf_counter() - t0,
    )
    return static
