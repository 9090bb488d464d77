"""A request's block table: its logical KV blocks, where each lives, and their state.

Per-block state follows from a few counters because blocks fill in token order:

- block i is SYNCED (full, never written again) iff ``(i + 1) * block_tokens <=
  num_computed``; the others are DIRTY;
- host copies exist for a prefix: block i has a host block iff ``i < len(hosts)``,
  a valid host copy iff ``i < num_host_valid``, and a copy landing (D2H in flight)
  iff ``num_host_valid <= i < num_host_copied``.

Eager rotation extends the copied prefix over SYNCED blocks; a preemption extends it
over the rest; a write into a block cuts it back to that block. So every operation is a
slice of two id lists, not a loop over block objects.
"""

from __future__ import annotations

import enum

NO_STEP = -1


class BlockState(enum.Enum):
    """DIRTY: partly filled, still written. SYNCED: full, never written again until the
    request finishes, so a host copy of it stays valid (DuplexKV §4.3.2)."""

    DIRTY = "dirty"
    SYNCED = "synced"


class BlockTable:
    """The logical blocks of one request, in token order.

    ``devices`` holds a device block id per logical block while the request is on the
    device (RUNNING) and is empty while it is ROTARY. ``hosts`` holds the host block ids
    of the leading blocks that have one. The ``*_step`` fields name the last step whose
    D2H copies, H2D copies or device-to-device moves touched the table; until those
    steps complete, the blocks involved are neither freed nor reused.

    With prefix caching, ``hashes`` holds the chained hash of each full block known so
    far and the leading ``num_published`` device blocks have been offered to the cache
    (``BlockPool.publish``); those may be shared with other tables.
    """

    __slots__ = (
        "d2h_step",
        "devices",
        "h2d_step",
        "hashes",
        "hosts",
        "model",
        "move_step",
        "num_computed",
        "num_host_copied",
        "num_host_published",
        "num_host_valid",
        "num_published",
        "request_id",
    )

    def __init__(self, request_id: str, model: str, devices: list[int]) -> None:
        self.request_id = request_id
        self.model = model
        self.devices = devices
        self.hosts: list[int] = []
        self.num_computed = 0
        self.num_host_valid = 0
        self.num_host_copied = 0
        self.d2h_step = NO_STEP
        self.h2d_step = NO_STEP
        self.move_step = NO_STEP
        self.hashes: list[bytes] = []  # prefix caching: hash of each full block known
        self.num_published = 0  # leading blocks offered to the prefix cache
        self.num_host_published = 0  # leading host copies offered to its host tier

    @property
    def on_device(self) -> bool:
        return bool(self.devices)

    def __len__(self) -> int:
        """Logical blocks: device blocks while on the device, host blocks otherwise."""
        return len(self.devices) if self.devices else len(self.hosts)

    def state(self, i: int, block_tokens: int) -> BlockState:
        synced = (i + 1) * block_tokens <= self.num_computed
        return BlockState.SYNCED if synced else BlockState.DIRTY

    def host_valid(self, i: int) -> bool:
        return i < self.num_host_valid

    def host_pending(self, i: int) -> bool:
        return self.num_host_valid <= i < self.num_host_copied

    def __repr__(self) -> str:
        return (
            f"BlockTable({self.request_id!r}, devices={self.devices}, hosts={self.hosts}, "
            f"computed={self.num_computed}, host_valid={self.num_host_valid}, "
            f"host_copied={self.num_host_copied}, steps d2h={self.d2h_step} "
            f"h2d={self.h2d_step} move={self.move_step})"
        )
