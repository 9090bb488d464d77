"""A run's results as they come: each rate saved on the run and appended to its CSV.

A rate's report as the load generator writes it (``--json``) holds ``errors``, one
string per request; a run of a million requests would store a million strings in the
run's JSON column. The database keeps each rate's figures (``error_counts`` among them)
and the CSV keeps the requests, each with its error.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from django.conf import settings

from shunter.engine.loadgen.report import CSV_FIELDS
from shunter.engine.loadgen.runner import RateResult
from shunter.platform.models import BenchmarkRun

# Fields of a rate's report with one entry per request: in the run's CSV, not its results.
PER_REQUEST_FIELDS = frozenset({"errors"})


def stored_result(row: dict[str, Any]) -> dict[str, Any]:
    """A rate's report as a run stores it: without ``PER_REQUEST_FIELDS``."""
    return {k: v for k, v in row.items() if k not in PER_REQUEST_FIELDS}


def csv_path(run: BenchmarkRun) -> Path:
    """Where a run's per-request rows are written."""
    return Path(settings.VAR_DIR) / "benchmarks" / f"run-{run.key}.csv"


class Progress:
    """Results and per-request rows as rates finish: each rate is saved on the run at
    once (the API shows a run's progress) and appended to its CSV file."""

    def __init__(self, run: BenchmarkRun) -> None:
        self.run_id = run.pk
        self.results: list[dict[str, Any]] = []
        self.path = csv_path(run)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=("series", *CSV_FIELDS))
        self._writer.writeheader()

    def add(self, series: str, result: RateResult) -> None:
        self.results.append(stored_result({"series": series, **result.to_dict()}))
        self._writer.writerows({"series": series, **row} for row in result.csv_rows())
        self._file.flush()
        BenchmarkRun.objects.filter(pk=self.run_id).update(results=self.results)

    def close(self) -> None:
        self._file.close()
