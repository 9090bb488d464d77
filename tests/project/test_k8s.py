"""deploy/k8s/ and deploy/compose.engine-host.yml cannot run here; check what they would
run, with what, and that their pieces refer to each other."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.http.request import validate_host
from django.urls import resolve

from shunter.platform import views
from shunter.project.cli import PASSTHROUGH, PASSTHROUGH_RUNNERS, build_parser
from tests.conftest import REPO
from tests.project.test_compose import DJANGO_ENV, SERVICES, shunter_subcommands

K8S = REPO / "deploy" / "k8s"
DOCS: list[dict[str, Any]] = [
    doc
    for path in sorted(K8S.glob("*.yaml"))
    for doc in yaml.safe_load_all(path.read_text())
    if doc is not None
]
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}
WORKLOADS = [d for d in DOCS if d["kind"] in WORKLOAD_KINDS]
ENGINE_HOST: dict[str, Any] = yaml.safe_load(
    (REPO / "deploy" / "compose.engine-host.yml").read_text()
)


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in DOCS if d["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    return found


def pod(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container_of(workload: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod(workload)["containers"]
    (container,) = containers
    return container


def command_of(workload: dict[str, Any]) -> list[str]:
    container = container_of(workload)
    return [*container.get("command", []), *container.get("args", [])]


def component(workload: dict[str, Any]) -> str:
    return str(workload["metadata"]["labels"]["app.kubernetes.io/component"])


def running(subcommand: str) -> list[dict[str, Any]]:
    return [w for w in WORKLOADS if command_of(w)[1] == subcommand]


def the_one_running(subcommand: str) -> dict[str, Any]:
    (workload,) = running(subcommand)
    return workload


DJANGO_WORKLOADS = [w for w in WORKLOADS if command_of(w)[1] in {"web", "worker", "beat", "manage"}]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (``matchLabels`` / ``matchExpressions``, or a Service's
    plain map) selects ``labels``."""
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] in {"In", "NotIn"}, expr  # the operators used here
        if (labels.get(expr["key"]) in expr["values"]) != (expr["operator"] == "In"):
            return False
    return True


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def mounted_volume(workload: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The volume mount of the container's at ``path`` and the pod's volume it mounts."""
    (mount,) = [m for m in container_of(workload)["volumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in pod(workload)["volumes"] if v["name"] == mount["name"]]
    return mount, volume


def assert_runs_shunter(command: list[str]) -> None:
    assert command[0] == "shunter"
    assert command[1] in shunter_subcommands()
    if command[1] in PASSTHROUGH:
        assert command[1] in PASSTHROUGH_RUNNERS
    else:  # its options are the subcommand's own: a renamed or removed one fails here
        assert build_parser().parse_args(command[1:]).command == command[1]


# -- the manifests -----------------------------------------------------------------------
def test_manifests_are_namespace_agnostic_and_commit_no_real_secret() -> None:
    assert {"Deployment", "StatefulSet", "Job", "Service", "ConfigMap"} <= {d["kind"] for d in DOCS}
    for doc in DOCS:
        assert doc["apiVersion"] and doc["metadata"]["name"], doc
        assert "namespace" not in doc["metadata"], doc["metadata"]["name"]
    for secret in of_kind("Secret"):
        values = {**secret.get("stringData", {}), **secret.get("data", {})}
        assert values, secret["metadata"]["name"]
        for key, value in values.items():
            assert "CHANGE-ME" in value, f"{key} looks like a real value"
    secrets = {p.name for p in K8S.glob("*.yaml") if "kind: Secret" in p.read_text()}
    assert secrets == {"secret.example.yaml"}


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w["metadata"]["name"])
def test_workload_runs_what_its_compose_service_runs(workload: dict[str, Any]) -> None:
    command = command_of(workload)
    assert_runs_shunter(command)
    # The same process as docker-compose.yml's service of that name.
    assert command == SERVICES[component(workload)]["command"]
    assert selects(workload["spec"].get("selector", {}), pod_labels(workload))


def test_every_compose_app_service_has_a_workload() -> None:
    apps = {name for name, s in SERVICES.items() if s.get("command", [""])[0] == "shunter"}
    assert {component(w) for w in WORKLOADS} == apps


@pytest.mark.parametrize("workload", DJANGO_WORKLOADS, ids=lambda w: w["metadata"]["name"])
def test_django_workloads_get_their_environment(workload: dict[str, Any]) -> None:
    container = container_of(workload)
    (secret,) = of_kind("Secret")
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        config = named("ConfigMap", source["configMapRef"]["name"])
        env.update(config["data"])
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:  # the Secret the example shows, with that key
            assert ref["name"] == secret["metadata"]["name"]
            assert ref["key"] in secret["stringData"]
        env[var["name"]] = var.get("value")
    assert set(env) >= DJANGO_ENV
    assert env["DEBUG"] == "0"


def test_beat_runs_alone_and_stops_before_its_successor_starts() -> None:
    beat = the_one_running("beat")
    assert beat["kind"] == "Deployment"
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    targets = {h["spec"]["scaleTargetRef"]["name"] for h in of_kind("HorizontalPodAutoscaler")}
    assert beat["metadata"]["name"] not in targets


def test_web_probes_ask_django_for_health_with_a_host_it_serves() -> None:
    web = the_one_running("web")
    container = container_of(web)
    port = int(build_parser().parse_args(command_of(web)[1:]).port)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert set(ports.values()) == {port}
    allowed = named("ConfigMap", "shunter-env")["data"]["ALLOWED_HOSTS"].split(",")
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert resolve(get["path"]).func is views.healthz
        assert ports.get(get["port"], get["port"]) == port
        # Kubelet sends the pod's IP as Host unless told otherwise; Django refuses it.
        (host,) = [h["value"] for h in get["httpHeaders"] if h["name"] == "Host"]
        assert validate_host(host, allowed)
        # Probes speak plain HTTP: the HTTPS redirect must let them through.
        path = get["path"].lstrip("/")
        assert any(re.search(p, path) for p in settings.SECURE_REDIRECT_EXEMPT)


def test_web_scales_on_cpu_from_two_replicas() -> None:
    web = the_one_running("web")
    assert web["kind"] == "Deployment"
    assert web["spec"]["replicas"] >= 2
    (hpa,) = of_kind("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", web["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2
    assert {m["resource"]["name"] for m in hpa["spec"]["metrics"]} == {"cpu"}
    # Utilization is measured against the request: without one the HPA cannot scale.
    assert container_of(web)["resources"]["requests"]["cpu"]


def test_engine_gets_a_gpu_node_its_token_and_a_config_that_parses(tmp_path: Path) -> None:
    from shunter.engine.server.settings import load_settings

    engine = the_one_running("engine")
    container = container_of(engine)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod(engine)["nodeSelector"]
    (token,) = [e for e in container["env"] if e["name"] == "SHUNTER_ENGINE_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"]["key"] == "SHUNTER_ENGINE_TOKEN"
    ns = build_parser().parse_args(command_of(engine)[1:])
    assert [p["containerPort"] for p in container["ports"]] == [ns.port]
    config = PurePosixPath(ns.config)
    _, volume = mounted_volume(engine, str(config.parent))
    text = named("ConfigMap", volume["configMap"]["name"])["data"][config.name]
    (tmp_path / config.name).write_text(text)
    engine_settings = load_settings(tmp_path / config.name, [])
    assert {m.sharing for m in engine_settings.models} == {"spatial", "temporal"}
    assert engine_settings.policy == "lvf+"  # the engine's default, as deploy/engine.toml
    # The models it loads at start are on the read-only models volume.
    mounts = [m for m in container["volumeMounts"] if m["name"] != volume["name"]]
    for model in engine_settings.models:
        assert any(
            PurePosixPath(model.path).is_relative_to(m["mountPath"]) and m.get("readOnly")
            for m in mounts
        ), model.path


def test_models_are_at_the_same_path_for_the_control_plane_and_the_engines() -> None:
    # model_create reads config.json in the web process; the engine loads the same path.
    engine, web = the_one_running("engine"), the_one_running("web")
    path = "/models"
    claims = []
    for workload in (engine, web):
        mount, volume = mounted_volume(workload, path)
        assert mount["readOnly"] is True
        claims.append(volume["persistentVolumeClaim"]["claimName"])
    assert claims[0] == claims[1]
    claim = named("PersistentVolumeClaim", claims[0])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # pods on several hosts


def test_web_serves_the_csvs_the_benchmark_worker_writes() -> None:
    web = the_one_running("web")
    (bench,) = [w for w in running("worker") if "benchmarks" in command_of(w)]
    path = "/var/lib/shunter/benchmarks"
    _, written = mounted_volume(bench, path)
    _, served = mounted_volume(web, path)
    assert written["persistentVolumeClaim"] == served["persistentVolumeClaim"]


def test_every_selector_selects_pods_that_have_the_port() -> None:
    for service in of_kind("Service"):
        chosen = [w for w in WORKLOADS if selects(service["spec"]["selector"], pod_labels(w))]
        assert chosen, service["metadata"]["name"]
        for workload in chosen:
            ports = container_of(workload)["ports"]
            for port in service["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                assert any(target in (p["containerPort"], p.get("name")) for p in ports)
    for budget in of_kind("PodDisruptionBudget"):
        assert any(selects(budget["spec"]["selector"], pod_labels(w)) for w in WORKLOADS)
    engine = the_one_running("engine")
    assert engine["kind"] != "StatefulSet" or named("Service", engine["spec"]["serviceName"])


def test_only_the_pods_that_call_engines_reach_them() -> None:
    (policy,) = of_kind("NetworkPolicy")
    engine = the_one_running("engine")
    assert selects(policy["spec"]["podSelector"], pod_labels(engine))
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    admitted = {component(w) for w in WORKLOADS if selects(source["podSelector"], pod_labels(w))}
    assert admitted == {"web", "worker", "benchmark-worker"}
    port = build_parser().parse_args(command_of(engine)[1:]).port
    assert [p["port"] for p in rule["ports"]] == [port]


# -- deploy/compose.engine-host.yml ------------------------------------------------------
def volumes(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Container path -> (host path, mode) of a compose service's bind mounts."""
    found = {}
    for spec in service["volumes"]:
        match = re.fullmatch(r"(?P<src>.+):(?P<dst>/[^:]*)(?::(?P<mode>ro|rw))?", spec)
        assert match, spec
        found[match["dst"]] = (match["src"], match["mode"] or "rw")
    return found


def test_engine_host_runs_the_engine_alone_as_the_main_compose_file_does() -> None:
    services = ENGINE_HOST["services"]
    assert set(services) == {"engine"}
    engine, main = services["engine"], SERVICES["engine"]
    assert engine["command"] == main["command"]
    assert_runs_shunter(engine["command"])
    ns = build_parser().parse_args(engine["command"][1:])
    *address, _, published = engine["ports"][0].split(":")
    assert int(published) == ns.port
    assert address and address != ["0.0.0.0"]  # published on one address only
    assert (REPO / "deploy" / engine["build"] / "Dockerfile").exists()
    assert engine["image"] == main["image"]


def test_engine_host_declares_a_gpu_its_token_and_a_config_that_parses() -> None:
    from shunter.engine.server.settings import load_settings

    engine = ENGINE_HOST["services"]["engine"]
    (device,) = engine["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]
    assert "SHUNTER_ENGINE_TOKEN" in engine["environment"]
    ns = build_parser().parse_args(engine["command"][1:])
    mounted = volumes(engine)
    source, mode = mounted[str(ns.config)]
    assert mode == "ro"
    engine_settings = load_settings(REPO / "deploy" / source, [])
    # The models at the same path, read-only, as on the control plane's engine.
    (models,) = {path for path in volumes(SERVICES["engine"]) if path != str(ns.config)}
    assert mounted[models][1] == "ro"
    for model in engine_settings.models:
        assert PurePosixPath(model.path).is_relative_to(models), model.path
