"""Policies by name, as ``SchedulerConfig.policy`` spells them."""

from __future__ import annotations

from shunter.engine.sched.fcfs import FcfsPolicy
from shunter.engine.sched.fixed_order import SwappedFirstPolicy, WaitingFirstPolicy
from shunter.engine.sched.lvf import LvfPlusPolicy, LvfPolicy, LvfShedPolicy
from shunter.engine.sched.policy import Policy

POLICY_CLASSES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        FcfsPolicy,
        WaitingFirstPolicy,
        SwappedFirstPolicy,
        LvfPolicy,
        LvfPlusPolicy,
        LvfShedPolicy,
    )
}


def make_policy(name: str) -> Policy:
    try:
        return POLICY_CLASSES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {sorted(POLICY_CLASSES)}") from None
