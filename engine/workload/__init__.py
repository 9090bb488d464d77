"""Workloads: the requests the simulator replays and the load generator sends.

``arrivals`` holds arrival processes (the named ones in ``ARRIVALS``), ``lengths``
request-length distributions (the named ones in ``WORKLOADS``) built from published
figures, ``generate`` the requests built from both and the shipped samples,
``sharegpt`` and ``traces`` the ShareGPT and JSONL trace files, ``requests`` the
requests themselves, ``tokens`` token counts and synthetic prompts, and ``sources`` the
load generator's sources of requests. No torch.
"""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
"""The measured length percentiles and the shipped sample traces."""
