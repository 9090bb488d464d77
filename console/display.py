"""How the console writes its numbers; ``static/console/console.js`` writes live updates
the same way (keep the two in step)."""

from __future__ import annotations

from dataclasses import dataclass

from shunter.console.selectors import WINDOWS_MIN, TenantRow

DASH = "—"


def percent(share: float | None) -> str:
    """``93.5%``; a dash without requests."""
    return DASH if share is None else f"{100 * share:.1f}%"


def rate(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}"


def byte_size(n: int | None) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1."""
    if n is None:
        return DASH
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def slo_text(row: TenantRow) -> str:
    """``interactive: TTFT ≤ 1000 ms, TBT ≤ 50 ms (0.95 both)``: a tenant's class, its
    targets and its attainment target, as the overview writes it beside attainment."""
    targets = ""
    if row["ttft_ms"] is not None and row["tbt_ms"] is not None:
        targets = f": TTFT ≤ {row['ttft_ms']:g} ms, TBT ≤ {row['tbt_ms']:g} ms"
    return f"{row['slo_class']}{targets} ({row['target']:g} both)"


@dataclass(frozen=True)
class Cell:
    """A table cell: ``field`` names it for live updates, ``css`` is its status class."""

    field: str
    text: str
    css: str = ""


def tenant_cells(row: TenantRow) -> list[Cell]:
    """The overview's cells of one tenant after its name: TTFT, TBT and joint attainment
    per window (joint coloured by status), then requests/s, tokens/s and errors."""
    cells: list[Cell] = []
    for w in WINDOWS_MIN:
        a = row["windows"][str(w)]
        cells += [
            Cell(f"w{w}-ttft", percent(a["ttft"])),
            Cell(f"w{w}-tbt", percent(a["tbt"])),
            Cell(f"w{w}-joint", percent(a["joint"]), f"status-{a['status']}"),
        ]
    cells += [
        Cell("rps", rate(row["requests_per_s"])),
        Cell("tps", rate(row["tokens_per_s"], 1)),
        Cell("errors", str(row["errors"])),
    ]
    return cells
