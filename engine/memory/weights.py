"""Where each model's weights sit in the arena: one run of whole pages per layer.

Giving every layer its own pages (instead of packing layers back to back) is what lets a
remapping controller hand one layer's pages to the KV cache and restore them later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shunter.engine.config import ModelSpec
from shunter.engine.memory.arena import FREE, Arena, PageOwner


@dataclass(frozen=True)
class WeightLayout:
    """Pages of one model's weights: ``layers[i]`` for decoder layer i, ``other`` for the
    embeddings, output head and final norm."""

    model: str
    layers: tuple[range, ...]
    other: range

    @property
    def num_pages(self) -> int:
        return len(self.other) + sum(len(r) for r in self.layers)


def pages_for(num_bytes: int, page_bytes: int) -> int:
    return -(-num_bytes // page_bytes)


def weight_pages(model: ModelSpec, page_bytes: int) -> int:
    """Pages a model's weights take: each decoder layer in whole pages of its own, and
    the embeddings, head and final norm in one run."""
    return pages_for(model.layer_bytes, page_bytes) * model.num_layers + pages_for(
        model.embedding_params * model.dtype_bytes, page_bytes
    )


def place_weights(arena: Arena, models: Sequence[ModelSpec]) -> dict[str, WeightLayout]:
    """Place every model's weights from the top of an empty arena downwards.

    Weights go to the top so the KV slabs grow from page 0 in one contiguous region (on
    an empty arena ``place_model``'s highest free run is just below the last one).
    Raises ValueError when the arena cannot hold them all.
    """
    needed = sum(weight_pages(m, arena.page_bytes) for m in models)
    if needed > arena.num_free_pages or arena.num_free_pages != arena.num_pages:
        raise ValueError(
            f"weights need {needed} pages of {arena.page_bytes} bytes; "
            f"the arena has {arena.num_free_pages} free of {arena.num_pages}"
        )
    return {m.name: place_model(arena, m) for m in models}


def place_model(arena: Arena, model: ModelSpec) -> WeightLayout:
    """Place one more model's weights into free runs of a running arena, highest first
    (away from the KV slabs growing from page 0).

    Each layer and the embeddings run take the highest free run that holds them. Raises
    ValueError, changing nothing, when a run does not fit.
    """
    taken: list[tuple[range, PageOwner]] = []

    def take(num_bytes: int, owner: PageOwner) -> range:
        num_pages = pages_for(num_bytes, arena.page_bytes)
        start = arena.find_free_run(num_pages, from_top=True)
        if start is None:
            for run, o in reversed(taken):
                arena.convert(run, o, FREE)
            raise ValueError(
                f"model {model.name!r}: no run of {num_pages} free pages of "
                f"{arena.page_bytes} bytes for {owner}"
            )
        run = range(start, start + num_pages)
        arena.convert(run, FREE, owner)
        taken.append((run, owner))
        return run

    other = take(model.embedding_params * model.dtype_bytes, PageOwner.weights(model.name, None))
    layers = tuple(
        take(model.layer_bytes, PageOwner.weights(model.name, i)) for i in range(model.num_layers)
    )
    return WeightLayout(model.name, layers, other)
