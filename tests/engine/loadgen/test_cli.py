"""``shunter bench serve`` and ``shunter bench loadgen`` as a user runs them."""

from __future__ import annotations

import csv
import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from shunter.engine.loadgen.cli import SAMPLE_SHAREGPT
from tests.conftest import VENV_BIN, free_port
from tests.engine.loadgen.conftest import ENGINE_MODEL, ENGINE_TOKEN

pytestmark = pytest.mark.slow


def shunter(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "shunter"), "bench", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_serve_writes_vllm_named_json_and_request_csv(sse_url: str, tmp_path: Path) -> None:
    out, rows = tmp_path / "result.json", tmp_path / "requests.csv"
    run = shunter(
        "serve", "--base-url", sse_url + "/v1", "--model", "fixture", "--api-key", "fx-key",
        "--endpoint", "chat", "--rps", "20,inf", "--num-requests", "15", "--burstiness", "2",
        "--dataset", "synthetic", "--input-len", "8", "--output-len", "10..30",
        "--ttft-slo-ms", "2000", "--tpot-slo-ms", "50", "--json", str(out),
        "--save-requests", str(rows),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "rate 20 req/s (gamma, burstiness 2)" in run.stdout
    assert "rate inf req/s" in run.stdout and "Mean TTFT (ms):" in run.stdout
    doc = json.loads(out.read_text())
    assert doc["endpoint_type"] == "openai-chat" and doc["model_id"] == "fixture"
    assert doc["dataset"] == "synthetic"
    first, second = doc["results"]
    assert first["request_rate"] == 20.0 and second["request_rate"] == "inf"
    assert first["burstiness"] == 2.0 and first["num_prompts"] == 15
    assert first["completed"] == 15 and first["failed"] == 0
    assert first["errors"] == [""] * 15 and first["error_counts"] == {}  # vLLM's: per request
    assert first["ttft_slo_ms"] == 2000.0 and first["tpot_slo_ms"] == 50.0
    assert first["slo_attainment"] == 1.0
    assert first["request_goodput"] == pytest.approx(first["request_throughput"])
    assert 15 * 10 <= first["total_output_tokens"] <= 15 * 30
    with rows.open() as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == 30 and {line["request_rate"] for line in lines} == {"20.0", "inf"}
    assert all(line["success"] == "True" for line in lines)
    assert all(10 <= int(line["output_tokens"]) <= 30 for line in lines)


# The fields vLLM's own tooling reads from a `vllm bench serve --save-result` file
# (vllm/benchmarks/serve.py, save_to_pytorch_benchmark_format), and those its README's
# comparison scripts tabulate.
VLLM_READ_FIELDS = (
    "median_ttft_ms", "mean_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
    "median_itl_ms", "mean_itl_ms", "std_itl_ms", "p99_itl_ms",
    "date", "backend", "model_id", "num_prompts", "request_rate", "burstiness",
    "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "request_throughput", "output_throughput",
    "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests",
)  # fmt: skip


def read_like_vllm(path: Path) -> list[dict[str, object]]:
    """What a script for vLLM's results does: one JSON object per line of the file
    (``--append-result`` writes several), every field it tabulates present."""
    docs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for doc in docs:
        missing = [f for f in VLLM_READ_FIELDS if f not in doc]
        assert not missing, missing
    return docs


def test_save_result_writes_vllms_document_per_rate(sse_url: str, tmp_path: Path) -> None:
    run = shunter(
        "serve", "--base-url", sse_url, "--model", "fixture", "--api-key", "fx-key",
        "--backend", "openai-chat", "--request-rate", "20,inf", "--num-prompts", "12",
        "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "20",
        "--random-range-ratio", "0.5", "--temperature", "0.5", "--header", "X-Run=7",
        "--goodput", "ttft:2000", "tpot:50", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99.9", "--save-result", "--save-detailed",
        "--result-dir", str(tmp_path / "out"), "--label", "shunter", "--metadata", "tp=1",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "Peak concurrent requests:" in run.stdout
    files = sorted((tmp_path / "out").iterdir())
    assert [f.name.split("-")[1] for f in files] == ["20.0qps", "infqps"]
    assert all(f.name.startswith("shunter-") and "-fixture-" in f.name for f in files)
    (first,) = read_like_vllm(files[0])
    (second,) = read_like_vllm(files[1])
    assert first["request_rate"] == 20.0 and second["request_rate"] == "inf"
    assert first["backend"] == "openai-chat" and first["label"] == "shunter"
    assert first["tp"] == "1" and first["num_prompts"] == 12 and first["completed"] == 12
    assert first["goodput_slos_ms"] == {"ttft": 2000.0, "tpot": 50.0}
    assert first["request_goodput"] == pytest.approx(first["request_throughput"])
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert {f"p50_{name}_ms", f"p99.9_{name}_ms", f"std_{name}_ms"} <= first.keys()
    lens = first["output_lens"]
    assert isinstance(lens, list) and all(10 <= n <= 30 for n in lens) and len(lens) == 12
    ttfts, itls, texts = first["ttfts"], first["itls"], first["generated_texts"]
    assert isinstance(ttfts, list) and all(isinstance(t, float) and t > 0 for t in ttfts)
    assert isinstance(itls, list) and [len(gaps) + 1 for gaps in itls] == lens
    assert isinstance(texts, list) and all(isinstance(t, str) and t for t in texts)
    assert first["max_concurrent_requests"] >= 1  # type: ignore[operator]
    # Appending keeps one document per line, as vLLM's --append-result does.
    for _ in range(2):
        again = shunter(
            "serve", "--base-url", sse_url, "--model", "fixture", "--api-key", "fx-key",
            "--num-prompts", "3", "--dataset-name", "random", "--random-input-len", "4",
            "--random-output-len", "4", "--append-result", "--result-filename",
            str(tmp_path / "all.json"),
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
    docs = read_like_vllm(tmp_path / "all.json")
    assert len(docs) == 2 and all(d["request_rate"] == "inf" for d in docs)
    assert all("ttfts" not in d and d["total_output_tokens"] == 12 for d in docs)


def test_serve_against_the_engine_with_its_tokenizer(
    engine_url: str, tiny_llama: Path, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    run = shunter(
        "serve", "--base-url", engine_url, "--model", ENGINE_MODEL, "--api-key", ENGINE_TOKEN,
        "--rps", "8", "--num-requests", "4", "--tokenizer", str(tiny_llama),
        "--dataset", f"sharegpt:{SAMPLE_SHAREGPT}",
        "--json", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    (result,) = json.loads(out.read_text())["results"]
    assert result["completed"] == 4 and result["mean_ttft_ms"] > 0
    assert result["total_input_tokens"] > 0  # the engine's usage


def test_prefix_repetition_prompts_hit_the_engines_prefix_cache(
    engine_url: str, tiny_llama: Path
) -> None:
    run = shunter(
        "serve", "--base-url", engine_url, "--model", ENGINE_MODEL, "--api-key", ENGINE_TOKEN,
        "--num-prompts", "6", "--max-concurrency", "1", "--tokenizer", str(tiny_llama),
        "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "64",
        "--prefix-repetition-suffix-len", "8", "--prefix-repetition-num-prefixes", "2",
        "--prefix-repetition-output-len", "2",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    request = urllib.request.Request(
        engine_url + "/metrics", headers={"Authorization": f"Bearer {ENGINE_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        text = r.read().decode()
    hits = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:prefix_cache_hits_total{")
    )
    assert hits >= 4 * 48  # each prefix's later requests find most of its blocks


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rps", "1", "--num-requests", "2", "--dataset", "csv:x"], "the dataset must be"),
        (["--dataset-name", "trace"], "the dataset must be"),
        (["--dataset-name", "random", "--dataset-path", "x"], "the dataset must be"),
        (["--dataset", "synthetic", "--dataset-name", "random"], "not both"),
        (["--rps", "inf", "--duration", "2"], "infinite rate needs --num-prompts"),
        (["--duration", "2"], "infinite rate needs --num-prompts"),
        (["--dataset-name", "random", "--random-range-ratio", "1.5"], "within [0, 1)"),
        (["--goodput", "ttft:100", "itl:5"], "goodput metric must be one of"),
        (["--goodput", "ttft:fast"], "could not convert"),
        (["--percentile-metrics", "ttft,latency"], "percentile metrics must be among"),
        (["--metric-percentiles", "101"], "percentiles must be within"),
        (["--extra-body", "[1]"], "expected a JSON object"),
        (["--header", "novalue"], "expected KEY=VALUE"),
        (["--rps", "1", "--num-requests", "2", "--dataset", "trace:/no/such"], "cannot read"),
        (["--rps", "0", "--num-requests", "2"], "rates must be positive"),
        (["--rps", "1", "--num-requests", "2", "--input-len", "9..3"], "bad length range"),
        (["--rps", "1", "--num-requests", "2", "--tokenizer", "/nonexistent"], "no tokenizer"),
        (["--rps", "1", "--num-requests", "2", "--base-url", "ftp://x"], "must start with http"),
    ],
)
def test_bad_arguments_are_clear_errors(args: list[str], message: str) -> None:
    base = ["--base-url", "http://127.0.0.1:9", "--model", "m"]
    run = shunter("serve", *base, *args)
    assert run.returncode == 2
    assert message in run.stderr and "Traceback" not in run.stderr


def test_unreachable_server_fails_every_request_without_a_traceback() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    run = shunter("serve", "--base-url", url, "--model", "m", "--rps", "50", "--num-requests", "3")
    assert (
        run.returncode == 1
        and "every request failed; the first: ClientConnectorError" in run.stderr
    )
    assert "(ClientConnectorError: 3)" in run.stdout and "Traceback" not in run.stderr
