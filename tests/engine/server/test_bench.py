"""``shunter bench server`` and ``bench prefix`` run end to end on tiny workloads."""

from __future__ import annotations

from pathlib import Path

from shunter.engine.benchfigure import BenchFigure
from shunter.engine.server.bench import bench_server
from shunter.engine.server.bench_prefix import bench_prefix


def test_bench_server_reports_both_paths_and_ratios(model_dirs: dict[str, Path]) -> None:
    lines = list(
        bench_server(
            model_dir=model_dirs["tiny-llama"],
            streams=(1, 2),
            requests=2,
            prompt_tokens=8,
            max_tokens=4,
            threads=1,
            rounds=1,
        )
    )
    rows = [line.split() for line in lines[2:]]
    assert [(r[0], r[1]) for r in rows] == [
        ("1", "in-process"), ("1", "server"), ("1", "ratio"),
        ("2", "in-process"), ("2", "server"), ("2", "ratio"),
    ]  # fmt: skip
    assert all(r[2].endswith("x") for r in rows if r[1] == "ratio")


def test_bench_prefix_reports_both_workloads_cache_on_and_off() -> None:
    items = list(
        bench_prefix(
            documents=2,
            questions=2,
            doc_tokens=128,
            question_tokens=8,
            conversations=2,
            turns=2,
            system_tokens=64,
            max_tokens=4,  # the last step's host copies land before the request ends
            concurrency=1,
            rounds=1,
        )
    )
    rows = [item.split() for item in items[3:11] if isinstance(item, str)]
    names = [" ".join(r[:3]) if r[0] == "doc" else " ".join(r[:2]) for r in rows]
    assert names == [
        "doc QA on", "chat on", "doc QA off", "chat off", "doc QA host",
        "doc QA on", "chat on", "doc QA host",
    ]  # fmt: skip
    # With the cache each document is computed once (its questions' last blocks aside);
    # without it, every time.
    on, off = int(rows[0][-2]), int(rows[2][-2])
    assert on < off
    assert off == 2 * 2 * (128 + 8)
    assert int(rows[2][-1]) == 0  # no host hits without the cache
    assert all(r[-1].endswith("off") for r in rows[5:])
    docqa, host = [item for item in items if isinstance(item, BenchFigure)]
    assert docqa.name == "prefix.docqa_ttft_p50_ratio" and docqa.value > 0
    assert host.name == "prefix.host_hit_ttft_ratio" and host.value > 0
    assert str(items[-1]).startswith("pool bookkeeping: looking up and taking back 256")
    assert [str(item).split()[:2] for item in items[13:16]] == [
        ["prefix", "recompute"], ["prefix", "host"], ["prefix", "device"],
    ]  # fmt: skip
