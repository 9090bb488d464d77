"""Consistency of one request's block table with the request's state."""

from __future__ import annotations

from shunter.engine.memory.table import BlockTable
from shunter.engine.request import Request, RequestState


def check_table(request: Request, table: BlockTable | None, block_tokens: int) -> None:
    """One request's table against its state.

    RUNNING: device blocks cover its computed tokens. ROTARY: no device block, and a
    valid or landing host copy of exactly its computed tokens' blocks. WAITING and
    FINISHED: no table. Always: valid <= copied <= host blocks, and only SYNCED blocks
    have host copies while the request is on the device, except right after a swap-in.
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
    if not table.num_host_valid <= table.num_host_copied <= len(table.hosts):
        raise AssertionError(f"request {rid!r}: host copy counters disagree: {table}")
    needed = -(-computed // block_tokens)
    if state is RequestState.RUNNING:
        if len(table.devices) < needed:
            raise AssertionError(f"running request {rid!r}: blocks do not cover its KV")
        if len(table.hosts) > len(table.devices):
            raise AssertionError(f"running request {rid!r}: more host than device blocks")
    else:
        if table.devices:
            raise AssertionError(f"rotary request {rid!r} holds device blocks")
        if len(table.hosts) != needed or table.num_host_copied != needed:
            raise AssertionError(f"rotary request {rid!r}: host copies do not cover its KV")
