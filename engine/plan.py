"""What one engine step does, as plain data: the StepPlan in, the StepResult out.

Like vLLM's ``SchedulerOutput``, a plan holds ids and integers only, so the torch
executor and the simulator read the same thing. Block ids index the model's own view of
the device arena (device blocks) or of its host swap space (host blocks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class BatchEntry(NamedTuple):
    """One request's work in this step's forward pass.

    The step computes KV for tokens ``[num_computed_tokens, num_computed_tokens +
    num_tokens)`` of the request; ``samples`` says whether it then samples a token
    (the chunk reaches the end of the known tokens).
    """

    request_id: str
    model: str
    num_tokens: int
    num_computed_tokens: int
    is_prefill: bool
    samples: bool


@dataclass
class BlockCopies:
    """One model's whole-block copies between the device and host tiers, one direction.

    Copy ``i`` moves device block ``devices[i]`` to or from host block ``hosts[i]``
    (block-first layout: each block is contiguous on both tiers). Two parallel id lists
    rather than one object per copy: a step may copy thousands of blocks, and transfer
    engines build their index tensors straight from these lists.
    """

    devices: list[int] = field(default_factory=list)
    hosts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.devices) != len(self.hosts):
            raise ValueError(f"{len(self.devices)} device blocks for {len(self.hosts)} host blocks")

    def extend(self, devices: list[int], hosts: list[int]) -> None:
        """Append the copies ``devices[i] <-> hosts[i]``."""
        if len(devices) != len(hosts):
            raise ValueError(f"{len(devices)} device blocks for {len(hosts)} host blocks")
        self.devices += devices
        self.hosts += hosts

    def __len__(self) -> int:
        return len(self.devices)

    def pairs(self) -> list[tuple[int, int]]:
        """``(device, host)`` of each copy, in order."""
        return list(zip(self.devices, self.hosts, strict=True))


class BlockMove(NamedTuple):
    """One device-to-device block move (compaction): copy ``src`` into ``dst``."""

    src: int
    dst: int


class LayerLoad(NamedTuple):
    """Copy decoder layer ``layer``'s weights host-to-device into weight frame ``frame``
    (the pages ``place_weights`` gave layer ``frame``)."""

    layer: int
    frame: int


class SlotStream(NamedTuple):
    """A remapped model's streamed layers, in execution order, and the frames they take
    turns in: the i-th streamed layer of a forward pass is copied into
    ``slots[i % len(slots)]``."""

    layers: tuple[int, ...]
    slots: tuple[int, ...]


@dataclass
class StepPlan:
    """Everything step ``step`` does.

    Request lists (ids):
      - ``preempted``: RUNNING -> ROTARY (or WAITING when preempted by recompute).
      - ``swapped_in``: ROTARY -> RUNNING; their H2D copies are in ``swap_in`` (they
        overlap this step's forward pass) and they join the batch at the first later
        step that finds those copies complete (cross-iteration pipeline).
      - ``admitted``: WAITING -> RUNNING with fresh device blocks.
      - ``prefix_loads``: admitted requests whose prompt's cached prefix is copied in
        from host memory (in ``swap_in``); like ``swapped_in`` ones they join the batch
        at the first later step that finds those copies complete.
      - ``released``: finished or aborted since the previous plan; an executor drops any
        per-request state it keeps.

    Copies, per model name, each one batch per direction:
      - D2H = ``swap_out`` (preemption copies) + ``rotate`` (eager rotation of SYNCED
        blocks); H2D = ``swap_in``. No device block is both an H2D destination and a
        pending D2H source, nor both a D2H source and a destination of ``moves``.
      - ``moves``: device-to-device moves, done before the forward pass reads KV.

    Weights, per model name (parameter remapping):
      - ``remapped``: weight frames handed to the KV cache this step; their pages may
        hold KV from this step on.
      - ``restored``: one-time host-to-device loads of layers into frames, to land
        before the model's next forward pass reads those layers (a frame taken back
        from the KV cache was emptied by this or an earlier step's ``moves``).
      - ``streams``: for each model in the batch with remapped layers, the layers its
        forward pass streams through slots: each copied host-to-device into its slot
        once the slot's previous layer has run, and waited on before it runs.

    ``batch`` lists decode entries first, then prefill chunks. What an executor reads
    for each entry, per request id, so that it needs nothing but the plan:
      - ``block_tables``: the request's device blocks in token order, after this
        step's ``moves``;
      - ``token_ids``: the entry's tokens (where the engine knows token ids; the
        simulator's requests have none).
    """

    step: int
    preempted: list[str] = field(default_factory=list)
    swapped_in: list[str] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    prefix_loads: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    batch: list[BatchEntry] = field(default_factory=list)
    swap_out: dict[str, BlockCopies] = field(default_factory=dict)
    rotate: dict[str, BlockCopies] = field(default_factory=dict)
    swap_in: dict[str, BlockCopies] = field(default_factory=dict)
    moves: dict[str, list[BlockMove]] = field(default_factory=dict)
    remapped: dict[str, list[int]] = field(default_factory=dict)
    restored: dict[str, list[LayerLoad]] = field(default_factory=dict)
    streams: dict[str, SlotStream] = field(default_factory=dict)
    block_tables: dict[str, list[int]] = field(default_factory=dict)
    token_ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def copied_in(self) -> list[str]:
        """The requests whose KV this step's H2D copies write (``swapped_in`` and
        ``prefix_loads``): a forward pass that reads their KV waits for the copies."""
        return [*self.swapped_in, *self.prefix_loads]

    def d2h(self, model: str) -> BlockCopies:
        """The model's whole device-to-host batch: preemption copies, then rotations
        (a new object: extending it changes neither)."""
        out = self.swap_out.get(model) or BlockCopies()
        rot = self.rotate.get(model) or BlockCopies()
        return BlockCopies(out.devices + rot.devices, out.hosts + rot.hosts)

    @property
    def num_d2h_blocks(self) -> int:
        return sum(map(len, self.swap_out.values())) + sum(map(len, self.rotate.values()))

    @property
    def num_h2d_blocks(self) -> int:
        return sum(map(len, self.swap_in.values()))

    @property
    def has_transfers(self) -> bool:
        return self.num_d2h_blocks > 0 or self.num_h2d_blocks > 0

    @property
    def num_batch_tokens(self) -> int:
        return sum(entry.num_tokens for entry in self.batch)


@dataclass
class StepResult:
    """What the executor reports for a plan.

    ``emitted`` maps each request that sampled a token to its token id (``None`` from an
    executor without real tokens, such as the simulator). ``stopped`` lists requests
    whose sampled token ends them (EOS, stop string); the engine also ends a request on
    its own when it reaches ``max_output_tokens``. ``duration_s`` is the step's time on
    the device, transfer waits included. ``compute_s`` is each model's forward pass
    without waits for weights (what remapping measures T_compute by), where the
    executor knows it. ``copy_s`` is, for each model whose layers were copied
    host-to-device in the step, the mean time one layer's copy took from when it could
    start to when it landed, with whatever else crossed the link meanwhile (what
    remapping measures T_T by), where the executor knows it.
    """

    duration_s: float
    emitted: dict[str, int | None] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)
    compute_s: dict[str, float] = field(default_factory=dict)
    copy_s: dict[str, float] = field(default_factory=dict)
