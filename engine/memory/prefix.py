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
from collections.abc import Sequence
from dataclasses import dataclass

BlockHash = bytes


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
