"""Where ``shunter engine`` takes its bearer token from (``--token-file``, ``--token``,
``$SHUNTER_ENGINE_TOKEN``) and the warnings it logs at startup: a token on the command
line is in the process list; no token leaves /admin/* and /metrics open."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shunter.engine.server.cli import METRICS_TOKEN_ENV, TOKEN_ENV, engine_token, metrics_token
from shunter.engine.server.settings import SettingsError
from shunter.project.cli import build_parser
from tests.conftest import VENV_BIN, Process, free_port
from tests.engine.server.conftest import request
from tests.waiting import wait_for

OPEN_WARNING = "no engine token"


def token_of(*args: str) -> str | None:
    return engine_token(build_parser().parse_args(["engine", *args]))


@pytest.fixture
def no_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def test_the_token_file_is_read_without_its_line_end(
    tmp_path: Path, no_env_token: None, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    path.write_text("s3cret-from-file\n")
    with caplog.at_level(logging.WARNING):
        assert token_of("--token-file", str(path)) == "s3cret-from-file"
    assert not caplog.records


def test_the_environment_serves_without_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret-from-env")
    with caplog.at_level(logging.WARNING):
        assert token_of() == "s3cret-from-env"
    assert not caplog.records


def test_token_on_the_command_line_works_but_warns_of_the_process_list(
    no_env_token: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert token_of("--token", "s3cret-argv") == "s3cret-argv"
    assert "process list" in caplog.text and "s3cret-argv" not in caplog.text


def test_no_token_warns_naming_the_open_routes(
    no_env_token: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert token_of() is None
    assert OPEN_WARNING in caplog.text
    assert "/admin/*" in caplog.text and "/metrics" in caplog.text


@pytest.mark.parametrize(
    ("content", "refusal"),
    [(None, "cannot read"), ("\n", "is empty"), ("tökén", "printable ASCII")],
)
def test_an_unusable_token_file_is_refused(
    tmp_path: Path, no_env_token: None, content: str | None, refusal: str
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SettingsError, match=refusal):
        token_of("--token-file", str(path))


def test_token_and_token_file_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        token_of("--token", "a", "--token-file", str(tmp_path / "token"))


class Engine(Process):
    """``shunter engine`` on CPU serving tiny-llama, with ``args``; ``$SHUNTER_ENGINE_TOKEN``
    unset."""

    def __init__(self, model_dir: Path, log: Path, *args: str) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        command = [str(VENV_BIN / "shunter"), "engine", "--device", "cpu", "--kv-tokens", "4096"]
        command += ["--port", self.url.rsplit(":", 1)[1], "--model", f"llama={model_dir}", *args]
        env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV} | {"OMP_NUM_THREADS": "1"}
        super().__init__(command, env, log)
        wait_for(self._healthy, 180, "the engine to come up", interval=0.1, detail=self.output)

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, f"the engine exited:\n{self.output()}"
        try:
            return request("GET", self.url + "/health").status_code == 200
        except OSError:
            return False


@pytest.fixture
def start(model_dirs: dict[str, Path], tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """Start engines with the given arguments; all stopped after the test."""
    started: list[Engine] = []

    def engine(*args: str) -> Engine:
        e = Engine(model_dirs["tiny-llama"], tmp_path / f"engine-{len(started)}.log", *args)
        started.append(e)
        return e

    yield engine
    for e in started:
        e.stop()


@pytest.mark.slow
def test_an_engine_with_a_token_file_refuses_other_callers(
    start: Callable[..., Engine], tmp_path: Path
) -> None:
    path = tmp_path / "token"
    path.write_text("file-token-1\n")
    engine = start("--token-file", str(path))
    for route in ("/metrics", "/admin/state", "/v1/models"):
        assert request("GET", engine.url + route).status_code == 401, route
        given = {"Authorization": "Bearer file-token-1"}
        assert request("GET", engine.url + route, headers=given).status_code == 200, route
    assert OPEN_WARNING not in engine.output() and "file-token-1" not in engine.output()


@pytest.mark.slow
def test_an_engine_without_a_token_says_at_startup_what_is_open(
    start: Callable[..., Engine],
) -> None:
    engine = start()
    assert request("GET", engine.url + "/admin/state").status_code == 200
    warning = [line for line in engine.output().splitlines() if OPEN_WARNING in line]
    assert len(warning) == 1 and "WARNING" in warning[0]
    assert "/admin/*" in warning[0] and "/metrics" in warning[0]


def test_the_scrape_token_comes_from_its_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def scrape_of(*args: str) -> str | None:
        return metrics_token(build_parser().parse_args(["engine", *args]))

    monkeypatch.delenv(METRICS_TOKEN_ENV, raising=False)
    assert scrape_of() is None
    monkeypatch.setenv(METRICS_TOKEN_ENV, "from-env")
    assert scrape_of() == "from-env"
    path = tmp_path / "scrape"
    path.write_text("from-file\n")
    assert scrape_of("--metrics-token-file", str(path)) == "from-file"
    path.write_text("has space\n")
    with pytest.raises(SettingsError, match="metrics token"):
        scrape_of("--metrics-token-file", str(path))
    assert build_parser().parse_args(["engine", "--open-metrics"]).open_metrics
