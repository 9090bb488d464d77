"""docker-compose.yml cannot run here; check what it would run and with what."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from shunter.project.cli import PASSTHROUGH, PASSTHROUGH_RUNNERS, build_parser
from tests.conftest import REPO

COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
DJANGO_ENV = {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS"}


def shunter_subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return set(action.choices) | set(PASSTHROUGH)  # type: ignore[arg-type]


def test_expected_services_exist() -> None:
    assert {"postgres", "redis", "web", "worker", "benchmark-worker", "beat", "engine"} <= set(
        SERVICES
    )


@pytest.mark.parametrize("name", sorted(n for n in SERVICES if n not in {"postgres", "redis"}))
def test_service_runs_a_real_shunter_subcommand(name: str) -> None:
    command = SERVICES[name]["command"]
    assert command[0] == "shunter"
    assert command[1] in shunter_subcommands()
    if command[1] in PASSTHROUGH:
        assert command[1] in PASSTHROUGH_RUNNERS
    else:  # its options are the subcommand's own: a renamed or removed one fails here
        assert build_parser().parse_args(command[1:]).command == command[1]


def test_engine_command_and_config_parse() -> None:
    from shunter.engine.server.settings import load_settings

    command = SERVICES["engine"]["command"]
    ns = build_parser().parse_args(command[1:])
    assert (ns.host, ns.port) == ("0.0.0.0", 8100)
    mounted = {v.split(":")[1]: v.split(":")[0] for v in SERVICES["engine"]["volumes"]}
    config = REPO / mounted[str(ns.config)]
    settings = load_settings(config, [])
    assert {m.sharing for m in settings.models} == {"spatial", "temporal"}


@pytest.mark.parametrize("name", ["web", "worker", "benchmark-worker", "beat", "migrate"])
def test_django_services_get_their_environment(name: str) -> None:
    env = SERVICES[name]["environment"]
    assert set(env) >= DJANGO_ENV
    assert env["DEBUG"] == "0"
    assert env["DATABASE_URL"].startswith("postgres://")
    assert "@postgres:5432/" in env["DATABASE_URL"]
    assert env["REDIS_URL"] == "redis://redis:6379/0"


def queues(service: str) -> list[str]:
    command = SERVICES[service]["command"]
    assert command[:2] == ["shunter", "worker"], command
    return str(command[command.index("--queues") + 1]).split(",")


def test_benchmark_runs_have_a_worker_of_their_own_and_polls_never_wait_behind_them() -> None:
    from shunter.benchmarks.tasks import benchmark_run_task
    from shunter.platform import tasks
    from shunter.project.celery import app

    conf = app.conf
    routed = {
        name: app.amqp.router.route({}, name)["queue"].name
        for name in (benchmark_run_task.name, tasks.node_poll_task.name)
    }
    assert routed[benchmark_run_task.name] == "benchmarks"
    assert routed[tasks.node_poll_task.name] == conf.task_default_queue
    assert queues("worker") == [conf.task_default_queue]
    assert queues("benchmark-worker") == ["benchmarks"]
    # The web server serves the per-request CSVs the benchmark worker writes.
    assert set(SERVICES["web"]["volumes"]) & set(SERVICES["benchmark-worker"]["volumes"])


def test_engine_reserves_a_gpu_and_gets_its_token() -> None:
    engine = SERVICES["engine"]
    (device,) = engine["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]
    assert "SHUNTER_ENGINE_TOKEN" in engine["environment"]


def test_every_long_running_service_has_a_health_check_and_data_is_in_volumes() -> None:
    for name, service in SERVICES.items():
        if name not in {"migrate", "beat"}:
            assert "healthcheck" in service, name
    declared = set(COMPOSE["volumes"])
    used = {v.split(":")[0] for s in SERVICES.values() for v in s.get("volumes", [])}
    assert {"postgres-data", "redis-data"} <= declared
    assert declared <= used


def test_the_web_health_check_passes_django_host_check() -> None:
    """Django answers 400 to a Host header outside ALLOWED_HOSTS: the check must send one
    that the service's ALLOWED_HOSTS allows, by default and with the README's own."""
    from django.http import HttpRequest
    from django.test import override_settings

    probe = SERVICES["web"]["healthcheck"]["test"][-1]
    host = re.search(r"'Host': '([^']+)'", probe)
    assert host is not None, probe
    value = COMPOSE["x-shunter-env"]["ALLOWED_HOSTS"]
    readme = re.search(r"^ALLOWED_HOSTS=(.+)$", (REPO / "README.md").read_text(), re.M)
    assert readme is not None
    for given in (None, readme.group(1)):
        # Compose's substitution: ${VAR:-default} is the default when VAR is unset.
        hosts = re.sub(r"\$\{ALLOWED_HOSTS:-([^}]*)\}", lambda m, g=given: g or m.group(1), value)
        request = HttpRequest()
        request.META = {"HTTP_HOST": host.group(1), "SERVER_NAME": "x", "SERVER_PORT": "8000"}
        with override_settings(ALLOWED_HOSTS=hosts.split(",")):
            assert request.get_host() == host.group(1), hosts


def test_web_reads_models_at_the_path_the_engine_loads_them() -> None:
    def models(service: str) -> set[str]:
        return {v for v in SERVICES[service]["volumes"] if v.split(":")[1] == "/models"}

    assert models("web") == models("engine")
    assert all(v.endswith(":ro") for v in models("web"))


def test_one_dockerfile_builds_every_app_service() -> None:
    assert (REPO / "Dockerfile").exists()
    for name in ("web", "worker", "benchmark-worker", "beat", "migrate", "engine"):
        assert SERVICES[name]["build"] == "."


def test_the_image_copies_every_package_folder() -> None:
    import tomllib

    folders = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
            "package-dir"
        ].values()
    )
    dockerfile = (REPO / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\S+) \1$", dockerfile, re.MULTILINE))
    assert folders <= copied, sorted(folders - copied)


@pytest.mark.parametrize("name", ["web", "worker", "benchmark-worker", "beat"])
def test_services_that_read_the_database_start_after_migrate(name: str) -> None:
    depends = SERVICES[name]["depends_on"]
    assert depends["migrate"] == {"condition": "service_completed_successfully"}


def test_the_benchmark_volume_mounts_a_folder_the_image_makes_for_its_user() -> None:
    mounts = {v.split(":")[1] for v in SERVICES["benchmark-worker"]["volumes"]}
    (target,) = [m for m in mounts if m.endswith("/benchmarks")]
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"mkdir -p {target}" in dockerfile and "chown -R shunter /var/lib/shunter" in dockerfile
    assert "USER shunter" in dockerfile


def test_the_web_port_is_published_on_loopback_unless_asked() -> None:
    (port,) = SERVICES["web"]["ports"]
    default = re.sub(r"\$\{SHUNTER_WEB_PORT:-([^}]*)\}", r"\1", port)
    assert default == "127.0.0.1:8000:8000"
