"""``shunter engine``'s start: an address it cannot listen on is one line, before any
model loads, not a traceback once they have."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest

from shunter.engine.server.cli import check_port
from shunter.engine.server.settings import SettingsError
from tests.conftest import VENV_BIN


def test_a_port_another_process_listens_on_is_refused_by_name() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SettingsError, match=re.escape(f"cannot listen on 127.0.0.1:{port}: ")):
            check_port("127.0.0.1", port)
    check_port("127.0.0.1", port)  # free again


def test_a_host_that_is_not_this_machines_is_refused() -> None:
    with pytest.raises(SettingsError, match=re.escape("cannot listen on nosuchhost.invalid:8100")):
        check_port("nosuchhost.invalid", 8100)


def test_the_engine_exits_with_one_line_when_its_port_is_taken(
    model_dirs: dict[str, Path],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        command = [str(VENV_BIN / "shunter"), "engine", "--device", "cpu", "--port", port]
        model = f"llama={model_dirs['tiny-llama']}"
        run = subprocess.run(
            [*command, "--model", model], capture_output=True, text=True, timeout=120
        )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"shunter engine: cannot listen on 127.0.0.1:{port}: " in run.stderr
