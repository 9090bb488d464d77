"""``shunter bench serve`` and ``shunter bench loadgen`` as a user runs them."""

from __future__ import annotations

import csv
import json
import subprocess
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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rps", "1", "--num-requests", "2", "--dataset", "csv:x"], "--dataset must be"),
        (["--num-requests", "2"], "--rps and one of --duration or --num-requests"),
        (["--rps", "1"], "--rps and one of --duration or --num-requests"),
        (["--rps", "inf", "--duration", "2"], "infinite rate needs --num-requests"),
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
    assert run.returncode == 1 and "every request failed" in run.stderr
    assert "(ClientConnectorError: 3)" in run.stdout and "Traceback" not in run.stderr
