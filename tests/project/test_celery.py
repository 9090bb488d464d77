"""The Celery application as the project loads it."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO, VENV_BIN

pytestmark = pytest.mark.slow


def test_loading_the_app_in_a_checkout_leaves_its_folders_off_the_front_of_sys_path(
    clean_env: dict[str, str],
) -> None:
    # Celery's Django fixup puts the working directory first on sys.path. From a checkout
    # the checkout's folders then shadowed installed modules of the same names:
    # transformers 5.25 imports Hugging Face's ``kernels`` and found ``kernels/`` here.
    code = "import os, sys; print('first:', sys.path[0] == os.getcwd())"
    done = subprocess.run(
        [str(VENV_BIN / "shunter"), "manage", "shell", "-c", code],
        cwd=REPO,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "first: False" in done.stdout, done.stdout
