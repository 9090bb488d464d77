"""Consistency of one request's block table with the request's state."""

from __future__ import annotations

from shunter.engine.memory.table import NO_BLOCK, BlockTable
from shunter.engine.request import Request, RequestState


def check_table(request: Request, table: BlockTable | None, block_tokens: int) -> None:
    """One request's table against its state.

    RUNNING: device blocks cover its computed tokens. ROTARY: exactly its computed
    tokens' blocks, all off the device, each with a valid or landing host copy.
    WAITING and FINISHED: no table. Block i is SYNCED iff its tokens are all computed.
    """
    rid, state = request.id, request.state
    if state in (RequestState.WAITING, RequestState.FINISHED):
        if table is not None:
            raise AssertionError(f"{state.name} request {rid!r} owns blocks")
        return
    if table is None:
        raise AssertionError(f"{state.name} request {rid!r} has no block table")
    computed = request.num_computed_tokens
    if table.num_computed != computed:
        raise AssertionError(f"request {rid!r}: table counts {table.num_computed} tokens")
    if state is RequestState.RUNNING:
        if not table.on_device or any(b.device == NO_BLOCK for b in table.blocks):
            raise AssertionError(f"running request {rid!r} has blocks off the device")
        if len(table) * block_tokens < computed:
            raise AssertionError(f"running request {rid!r}: blocks do not cover its KV")
    else:
        if table.on_device or any(b.device != NO_BLOCK for b in table.blocks):
            raise AssertionError(f"rotary request {rid!r} holds device blocks")
        if len(table) != -(-computed // block_tokens):
            raise AssertionError(f"rotary request {rid!r}: {len(table)} blocks")
        if any(b.host == NO_BLOCK or not b.has_host_copy for b in table.blocks):
            raise AssertionError(f"rotary request {rid!r}: a block has no host copy")
    for i, b in enumerate(table.blocks):
        if b.synced != ((i + 1) * block_tokens <= computed):
            raise AssertionError(f"request {rid!r}: block {i} is {b.state.name}")
