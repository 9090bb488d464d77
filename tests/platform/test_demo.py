"""`shunter demo` end to end: migrate the embedded default, create the admin, serve, log in."""

from __future__ import annotations

import http.cookiejar
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, VENV_BIN, free_port

pytestmark = pytest.mark.slow


def wait_for(url: str, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout}s")


def admin_login(base: str, username: str, password: str) -> str:
    """Log in through the admin's form as a browser would; return the admin index page."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    form = opener.open(f"{base}/admin/login/?next=/admin/").read().decode()
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert match, form
    data = urllib.parse.urlencode(
        {
            "csrfmiddlewaretoken": match.group(1),
            "username": username,
            "password": password,
            "next": "/admin/",
        }
    ).encode()
    request = urllib.request.Request(
        f"{base}/admin/login/?next=/admin/", data=data, headers={"Referer": f"{base}/admin/login/"}
    )
    return str(opener.open(request).read().decode())


def test_demo_serves_home_and_admin(clean_env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    env = {**clean_env, "SHUNTER_ADMIN_PASSWORD": "demo pass 4 tests"}
    proc = subprocess.Popen(
        [str(VENV_BIN / "shunter"), "demo", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{base}/healthz", proc)
        home = urllib.request.urlopen(f"{base}/").read().decode()
        assert "embedded default" in home and "InMemoryChannelLayer" in home
        index = admin_login(base, "admin", "demo pass 4 tests")
        assert "Site administration" in index
        css = urllib.request.urlopen(f"{base}/static/admin/css/base.css")
        assert css.status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert "admin user: admin  password: from SHUNTER_ADMIN_PASSWORD" in output
    assert (tmp_path / "var" / "shunter.sqlite3").exists()


def test_demo_generates_a_password_once(clean_env: dict[str, str]) -> None:
    command = [str(VENV_BIN / "shunter"), "demo", "--no-serve"]
    first = subprocess.run(
        command, cwd=REPO, env=clean_env, capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr
    match = re.search(r"admin user: admin  password: (\S+)  \(shown once\)", first.stdout)
    assert match, first.stdout
    second = subprocess.run(
        command, cwd=REPO, env=clean_env, capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stderr
    assert match.group(1) not in second.stdout
    assert "exists; set SHUNTER_ADMIN_PASSWORD to reset it" in second.stdout
