"""A request's block table: its logical KV blocks, where each lives, and their state."""

from __future__ import annotations

import enum

NO_BLOCK = -1
NO_STEP = -1


class BlockState(enum.Enum):
    """DIRTY: partly filled, still written. SYNCED: full, never written again until the
    request finishes, so a host copy of it stays valid (DuplexKV §4.3.2)."""

    DIRTY = "dirty"
    SYNCED = "synced"


class Block:
    """One logical KV block of a request.

    ``device`` / ``host`` are block ids in the model's device and host views
    (``NO_BLOCK`` when absent). ``host_valid`` says the host copy holds the block's
    current contents; ``host_pending`` that a D2H copy into it is in flight.
    ``xfer_step`` is the step whose copy (or move) last touched the block; until that
    step's transfers complete the block is neither freed nor copied.
    """

    __slots__ = ("device", "host", "host_pending", "host_valid", "synced", "xfer_step")

    def __init__(self, device: int) -> None:
        self.device = device
        self.host = NO_BLOCK
        self.host_valid = False
        self.host_pending = False
        self.synced = False
        self.xfer_step = NO_STEP

    @property
    def state(self) -> BlockState:
        return BlockState.SYNCED if self.synced else BlockState.DIRTY

    @property
    def has_host_copy(self) -> bool:
        """A valid host copy exists or is landing: preemption need not copy it."""
        return self.host_valid or self.host_pending

    def __repr__(self) -> str:
        return (
            f"Block(device={self.device}, host={self.host}, {self.state.name}, "
            f"host_valid={self.host_valid}, host_pending={self.host_pending}, "
            f"xfer_step={self.xfer_step})"
        )


class BlockTable:
    """The logical blocks of one request, in token order.

    While the request is RUNNING every block has a device id (``on_device``); while it
    is ROTARY none has, and every block has a valid (or in-flight) host copy.
    ``num_computed`` mirrors the tokens whose KV is stored; ``rotated`` counts the
    leading SYNCED blocks whose host copy exists or is in flight, where eager rotation
    resumes. ``ready_step`` is the last step whose copies a swap-in must wait for.
    """

    __slots__ = (
        "blocks",
        "model",
        "num_computed",
        "on_device",
        "ready_step",
        "request_id",
        "rotated",
    )

    def __init__(self, request_id: str, model: str) -> None:
        self.request_id = request_id
        self.model = model
        self.blocks: list[Block] = []
        self.num_computed = 0
        self.on_device = True
        self.rotated = 0
        self.ready_step = NO_STEP

    def __len__(self) -> int:
        return len(self.blocks)

    def device_ids(self) -> list[int]:
        return [b.device for b in self.blocks]

    def host_ids(self) -> list[int]:
        return [b.host for b in self.blocks]
