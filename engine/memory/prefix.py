"""Automatic prefix caching: the identity of a full KV block, and what the cache served.

A full block's KV depends on every token before it, so its identity is a hash chained
over the token ids of all blocks up to it (vLLM's block hash). The chain starts from a
*salt*: the model's name, and the request's ``cache_salt`` when it gives one, so that
KV is only ever shared between requests that agreed to share it (timing can reveal
whether another tenant sent a prompt: a deployment that keeps tenants apart salts each
tenant's requests with its own name).

BLAKE2b with a 16-byte digest, not Python's ``hash``: a client who could make two
prompts collide would be served another prompt's KV.

Pure logic: no torch.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

BlockHash = bytes
Block = TypeVar("Block", bound=Hashable)


def chain_start(model: str, salt: str | None) -> BlockHash:
    """The hash the chain of a request's first block starts from."""
    seed = model if salt is None else f"{model}\0{salt}"
    return hashlib.blake2b(seed.encode(), digest_size=16).digest()


def block_hashes(
    token_ids: Sequence[int], block_tokens: int, parent: BlockHash, start: int = 0
) -> list[BlockHash]:
    """The chained hash of each *full* block of ``token_ids`` from block ``start`` on;
    ``parent`` is the hash of block ``start - 1`` (``chain_start`` when ``start`` is 0)."""
    out: list[BlockHash] = []
    for first in range(start * block_tokens, len(token_ids) - block_tokens + 1, block_tokens):
        tokens = array("q", token_ids[first : first + block_tokens]).tobytes()
        parent = hashlib.blake2b(parent + tokens, digest_size=16).digest()
        out.append(parent)
    return out


class PublishedBlocks(Generic[Block]):
    """The blocks of one store (a model's device pool: block ids; the host swap space:
    ``(model, id)``) that hold a published full block of KV: the hash each holds, the
    holders of those shared beyond one, and the *cached* ones, published and held by
    nobody, least recently freed first. The store keeps its own free blocks; this is
    what prefix caching adds to them, the same on both tiers."""

    def __init__(self) -> None:
        self._block_of: dict[BlockHash, Block] = {}
        self._hash_of: dict[Block, BlockHash] = {}
        self._extra_holders: dict[Block, int] = {}
        self.cached: dict[Block, None] = {}  # insertion order: least recently freed first

    @property
    def active(self) -> bool:
        """Whether any block is published or shared (else ``drop`` needs no call)."""
        return bool(self._hash_of or self._extra_holders)

    def is_published(self, block: Block) -> bool:
        return block in self._hash_of

    def publish(self, block: Block, block_hash: BlockHash) -> None:
        """A used block now holds the KV ``block_hash`` names. A hash already published
        keeps its block (this one stays private)."""
        if block_hash not in self._block_of and block not in self._hash_of:
            self._block_of[block_hash] = block
            self._hash_of[block] = block_hash

    def lookup(self, hashes: Sequence[BlockHash]) -> Iterator[Block]:
        """The blocks holding the longest published prefix of ``hashes``, in order."""
        block_of = self._block_of
        for h in hashes:
            block = block_of.get(h)
            if block is None:
                return
            yield block

    def hold(self, block: Block) -> bool:
        """One more holder of a published or used block; True when it was cached (it
        leaves the store's free blocks)."""
        if block in self.cached:
            del self.cached[block]
            return True
        self._extra_holders[block] = self._extra_holders.get(block, 0) + 1
        return False

    def drop(self, block: Block) -> bool:
        """One holder fewer; True when the block is left without any."""
        n = self._extra_holders.get(block)
        if n is None:
            return True
        if n == 1:
            del self._extra_holders[block]
        else:
            self._extra_holders[block] = n - 1
        return False

    def num_holders(self, block: Block) -> int:
        """Holders of a used block (1 unless it is shared)."""
        return 1 + self._extra_holders.get(block, 0)

    def moved(self, src: Block, dst: Block) -> None:
        """A used block's KV and holders moved from ``src`` to ``dst``."""
        block_hash = self._hash_of.pop(src, None)
        if block_hash is not None:
            self._hash_of[dst] = block_hash
            self._block_of[block_hash] = dst
        extra = self._extra_holders.pop(src, None)
        if extra is not None:
            self._extra_holders[dst] = extra

    def forget(self, block: Block) -> None:
        """The block's KV is going (it is allocated, drained or given back)."""
        block_hash = self._hash_of.pop(block, None)
        if block_hash is not None:
            del self._block_of[block_hash]
        self.cached.pop(block, None)

    def evict_oldest(self) -> Block:
        """Forget the least recently freed cached block and return it."""
        block = next(iter(self.cached))
        self.forget(block)
        return block

    def check(self, kept: set[Block], within: Callable[[Block], bool] = lambda _: True) -> None:
        """Hashes name blocks one to one; only published blocks are cached; every
        published or shared block ``within`` the caller's scope is cached or in ``kept``
        (those tables and copies in flight hold)."""
        if {b: h for h, b in self._block_of.items()} != self._hash_of:
            raise AssertionError("published hashes and blocks disagree")
        if not self.cached.keys() <= self._hash_of.keys():
            raise AssertionError("a cached block is not published")
        if any(within(b) and b not in kept and b not in self.cached for b in self._hash_of):
            raise AssertionError("a published block is neither cached nor held")
        if any(within(b) and b not in kept for b in self._extra_holders):
            raise AssertionError("a shared block is not held")


def request_salt(tenant: str, salt: str | None, *, across_tenants: bool) -> str | None:
    """The salt of a request's chain: its tenant (unless the deployment shares cached
    prefixes across tenants) and the client's own ``cache_salt``, either or both."""
    parts = [tenant if not across_tenants else "", salt or ""]
    return "\0".join(parts) if any(parts) else None


@dataclass
class PrefixStats:
    """Prompt tokens looked up in the cache and those found, since the engine started
    (vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits`` counters), per model;
    ``host_hits`` are the hits found in host memory (copied in, not recomputed)."""

    queries: dict[str, int]
    hits: dict[str, int]
    host_hits: dict[str, int]

    @classmethod
    def empty(cls) -> PrefixStats:
        return cls({}, {}, {})

    def record(self, model: str, queried: int, hit: int, host_hit: int = 0) -> None:
        self.queries[model] = self.queries.get(model, 0) + queried
        self.hits[model] = self.hits.get(model, 0) + hit + host_hit
        self.host_hits[model] = self.host_hits.get(model, 0) + host_hit
