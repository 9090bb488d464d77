"""The shunter namespace: same imports from the checkout and from a built wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

MAPPED = [
    "project",
    "common",
    "platform",
    "gateway",
    "benchmarks",
    "tenants",
    "console",
    "engine",
    "kernels",
    "migrations",
]
# The top-level packages from the bottom up: each may import only those before it
# (the engine and its kernels know nothing of the control plane; the project wires all).
LAYERS = [
    "kernels",
    "engine",
    "common",
    "platform",
    "tenants",
    "benchmarks",
    "console",
    "gateway",
    "project",
]


def run_python(code: str, *, cwd: Path, python: str = sys.executable, **env: str) -> str:
    result = subprocess.run(
        [python, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_stdlib_platform_is_not_shadowed_from_repo_root() -> None:
    out = run_python("import platform; print(platform.system(), platform.__file__)", cwd=REPO)
    system, path = out.split()
    assert system
    assert not path.startswith(str(REPO)), path


def test_settings_import_from_repo_root() -> None:
    out = run_python("import shunter.project.settings as s; print(s.ROOT_URLCONF)", cwd=REPO)
    assert out.strip() == "shunter.project.urls"


def test_platform_folder_is_a_namespace_portion() -> None:
    assert not (REPO / "platform" / "__init__.py").exists()


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert {f"shunter.{name}" for name in MAPPED} <= listed
    assert config["package-dir"] == {f"shunter.{name}": name for name in MAPPED}
    on_disk = set()
    for top in MAPPED:
        for folder in [REPO / top, *(p for p in (REPO / top).rglob("*") if p.is_dir())]:
            code = any(folder.glob("*.py"))
            # A folder of package data only (templates, static files, shipped data) is
            # listed too, or setuptools warns that it installs it as data.
            data = not code and any(f.is_file() for f in folder.iterdir())
            if "__pycache__" in folder.parts or not (code or data):
                continue
            rel = folder.relative_to(REPO).parts
            on_disk.add(".".join(("shunter", *rel)))
    assert on_disk == listed, f"missing: {on_disk - listed}, stale: {listed - on_disk}"


@pytest.mark.slow
def test_wheel_installs_and_imports_in_a_fresh_venv(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",  # the build backend's own output, its warnings included
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert b"absent from the `packages` configuration" not in build.stderr + build.stdout
    (wheel,) = dist.glob("shunter-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "shunter/project/settings.py" in names
    assert "shunter/platform/models.py" in names
    assert "shunter/platform/__init__.py" not in names
    assert "shunter/platform/templates/platform/home.html" in names
    assert "shunter/migrations/platform/__init__.py" in names
    assert not any(name.startswith(("tests/", "platform/")) for name in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # Install the wheel alone: its dependencies come from this environment's
    # site-packages, appended after the fresh venv's own on sys.path.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    deps = sysconfig.get_paths()["purelib"]
    code = (
        f"import sys; sys.path.append({deps!r})\n"
        "import platform, shunter.project.settings as s, shunter.engine, shunter.tenants\n"
        "import django; django.setup()\n"
        "from django.apps import apps\n"
        "print(platform.system(), shunter.engine.__file__, apps.get_app_config('platform').path)"
    )
    out = run_python(
        code,
        cwd=tmp_path,
        python=python,
        DJANGO_SETTINGS_MODULE="shunter.project.settings",
        SHUNTER_VAR_DIR=str(tmp_path / "var"),
    )
    system, engine_file, app_path = out.split()
    assert system
    assert engine_file.startswith(str(venv)), engine_file
    assert app_path.startswith(str(venv)), app_path


def _imports(folder: str) -> dict[str, set[str]]:
    """Each module file under ``folder`` -> the ``shunter.*`` modules it imports
    (anywhere in it: a function's lazy import counts)."""
    import ast

    found: dict[str, set[str]] = {}
    for path in (REPO / folder).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "shunter":
                names.update(f"shunter.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[str(path.relative_to(REPO))] = {n for n in names if n.startswith("shunter.")}
    return found


def _top(name: str) -> str:
    return name.split(".")[1] if "." in name else name


def test_each_top_level_package_imports_only_those_below_it() -> None:
    # No cycle between top-level packages: the layers are a total order.
    assert sorted(LAYERS) == sorted(set(MAPPED) - {"migrations"})
    for rank, folder in enumerate(LAYERS):
        below = set(LAYERS[:rank]) | {folder}
        for path, names in _imports(folder).items():
            above = {n for n in names if _top(n) not in below}
            assert not above, f"{path} imports {sorted(above)}"


def test_the_engine_imports_no_control_plane_package() -> None:
    control_plane = set(LAYERS[LAYERS.index("common") :])
    for folder in ("engine", "kernels"):
        for path, names in _imports(folder).items():
            outside = {n for n in names if _top(n) in control_plane}
            assert not outside, f"{path} imports {sorted(outside)}"


def test_nothing_outside_the_engine_imports_the_engine_server() -> None:
    # The wire format the control plane shares with the engine is ``engine.api``.
    for folder in set(MAPPED) - {"engine"}:
        for path, names in _imports(folder).items():
            server = {n for n in names if n.startswith("shunter.engine.server")}
            assert not server, f"{path} imports {sorted(server)}"


def test_the_wire_format_imports_no_torch_aiohttp_or_django() -> None:
    # What the gateway shares with the engine loads in a process that has none of them.
    modules = ", ".join(
        f"shunter.engine.api.{m}"
        for m in (
            "deployments",
            "errors",
            "fields",
            "headers",
            "jsonbody",
            "protocol",
            "state",
            "timing",
        )
    )
    out = run_python(
        f"import sys, {modules}; print(sorted(m for m in ('torch', 'aiohttp', 'django') "
        "if m in sys.modules))",
        cwd=REPO,
    )
    assert out.strip() == "[]"
