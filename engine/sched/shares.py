"""Max-min fair shares of one step's prefill tokens among the models that want them.

Pure logic: no torch. One model's long prompt, or one tenant's burst of admissions,
must not hold every prefill token of a step while another model's request waits: each
model with prefill work gets an equal share, a model that needs less than its share
gets what it needs, and what it leaves is shared by the others again (water-filling).
Within a model the order stays the scheduler's (running chunks, then the policy's
admissions). With one model, or a budget that covers every demand, nothing changes.
"""

from __future__ import annotations

from collections.abc import Mapping


def fair_shares(demand: Mapping[str, int], tokens: int) -> dict[str, int]:
    """Tokens for each model of ``demand`` (tokens it could use) out of ``tokens``: the
    max-min fair split, never more than a model's demand, all of ``tokens`` used while
    demand is left. When fewer tokens than models remain, the least demanding models
    (then by name) get one each."""
    shares = dict.fromkeys(demand, 0)
    left = max(0, tokens)
    open_models = sorted((m for m in demand if demand[m] > 0), key=lambda m: (demand[m], m))
    while open_models and left > 0:
        each = left // len(open_models)
        if each == 0:
            for m in open_models[:left]:
                shares[m] += 1
            break
        smallest = open_models[0]
        rest = demand[smallest] - shares[smallest]
        if rest <= each:
            shares[smallest] += rest
            left -= rest
            open_models.pop(0)
            continue
        for m in open_models:
            shares[m] += each
        left -= each * len(open_models)
    return shares
