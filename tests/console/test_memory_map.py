"""The memory map and the node figures from an engine snapshot (pure functions)."""

from __future__ import annotations

from shunter.console.figures import memory_figure
from shunter.console.memory_map import ROW_HBM, ROW_HOST, ROW_LENT, memory_map
from tests.console.states import PAGE, engine_like_state


def test_hbm_row_is_the_arena_by_owner() -> None:
    state = engine_like_state()
    mem = memory_map(state, {})
    hbm = mem.row(ROW_HBM)
    pages = state["arena"]["pages_by_owner"]
    assert [(s.kind, s.model) for s in hbm] == [
        ("weights", "llama"),
        ("weights", "qwen"),
        ("kv", "llama"),
        ("kv", "qwen"),
        ("free", None),
    ]
    for s in hbm:
        key = "free" if s.kind == "free" else f"{s.kind}:{s.model}"
        assert s.bytes == pages[key] * PAGE
    # Segments tile the row: each starts where the previous one ended, up to the arena.
    ends = [s.offset + s.bytes for s in hbm]
    assert [s.offset for s in hbm[1:]] == ends[:-1]
    assert ends[-1] == mem.hbm_bytes == state["arena"]["num_pages"] * PAGE


def test_lent_pages_sit_under_the_kv_region() -> None:
    state = engine_like_state()
    mem = memory_map(state, {})
    (lent,) = mem.row(ROW_LENT)
    assert lent.model == "llama" and lent.bytes == state["models"]["llama"]["weight_bytes_remapped"]
    kv_start = min(s.offset for s in mem.row(ROW_HBM) if s.kind == "kv")
    assert lent.offset == kv_start


def test_host_row_holds_weight_copies_and_swap() -> None:
    state = engine_like_state()
    mem = memory_map(state, {"qwen": 600_000})
    host = {(s.kind, s.model): s.bytes for s in mem.row(ROW_HOST)}
    llama = state["models"]["llama"]
    # A model the control plane knows: its parameter bytes; else resident + remapped.
    assert host[("host_weights", "qwen")] == 600_000
    assert host[("host_weights", "llama")] == (
        llama["weight_bytes_resident"] + llama["weight_bytes_remapped"]
    )
    swap = state["host_swap"]
    assert host[("swap", None)] == swap["bytes_used"]
    assert host[("swap_free", None)] == swap["bytes_total"] - swap["bytes_used"]
    assert mem.host_bytes == sum(host.values())


def test_malformed_state_gives_an_empty_map() -> None:
    mem = memory_map({"models": "nope", "arena": None}, {})
    assert mem.segments == () and mem.hbm_bytes == 0


def test_memory_figure_draws_every_segment_at_its_offset() -> None:
    state = engine_like_state()
    mem = memory_map(state, {})
    fig = memory_figure(mem, ["llama", "qwen"])
    assert len(fig["data"]) == len(mem.segments)
    layout = fig["layout"]
    # About 3 MiB of device memory: drawn in KiB (a unit keeps at least 4 of the row).
    assert layout["xaxis"]["title"]["text"] == "device, KiB"
    for trace, s in zip(fig["data"], mem.segments, strict=True):
        assert trace["y"] == [s.row]
        unit = 1024.0 if s.row != ROW_HOST else _unit(layout["xaxis2"]["title"]["text"])
        assert trace["base"][0] * unit == s.offset
        assert f"{s.bytes:,} bytes" in trace["hovertemplate"]
    lent = [t for t in fig["data"] if t["y"] == [ROW_LENT]]
    assert lent and all(t["marker"]["pattern"]["shape"] == "/" for t in lent)


def test_device_and_host_each_have_their_own_scale_and_weights_differ_from_copies() -> None:
    state = engine_like_state()
    # A host swap space 100 times the device: on one axis the device would be a sliver.
    state["host_swap"] = {"bytes_used": 0, "bytes_total": 300 * 1024**2}
    mem = memory_map(state, {})
    fig = memory_figure(mem, ["llama", "qwen"])
    layout = fig["layout"]
    assert layout["xaxis"]["title"]["text"] == "device, KiB"
    assert layout["xaxis2"]["title"]["text"] == "host, MiB"
    device = [t for t in fig["data"] if t["y"] != [ROW_HOST]]
    host = [t for t in fig["data"] if t["y"] == [ROW_HOST]]
    assert {t["xaxis"] for t in device} == {"x"} and {t["xaxis"] for t in host} == {"x2"}
    weights = {t["marker"]["color"] for t in device if t["name"].endswith(" weights")}
    copies = [t["marker"] for t in host if t["name"].endswith("weight copy")]
    assert copies and all(
        m["color"] not in weights and m["pattern"]["shape"] == "." for m in copies
    )


def _unit(title: str) -> float:
    return {"B": 1.0, "KiB": 1024.0, "MiB": 1024.0**2, "GiB": 1024.0**3}[title.split(", ")[1]]
