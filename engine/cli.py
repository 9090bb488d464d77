"""Engine-side subcommands of ``shunter`` (simulate, bench, ...).

Imports nothing heavy at module level: ``shunter --help`` must stay fast.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the engine's subcommands to the ``shunter`` parser."""
    from shunter.engine.sim.cli import add_simulate_parser

    add_simulate_parser(sub)
