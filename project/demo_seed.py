"""The demo in the control plane: its rows registered (``seed_demo``), its node pointed at
this run's engine, the tenants' keys kept in ``var/demo/keys.json`` (mode 0600), and the
embedded database set up for the demo's concurrent writers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shunter.project.demo_children import DemoError
from shunter.project.demo_engine import HBM_BUDGET, EngineProcess
from shunter.project.demo_paths import DemoPaths, write_private
from shunter.project.demo_traffic import LOAD


def _read_keys(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(tenant): str(entry["key"])
        for tenant, entry in data.items()
        if isinstance(entry, dict) and isinstance(entry.get("key"), str)
    }


def _drop_unknown_keys(known: dict[str, str]) -> dict[str, str]:
    """The ``known`` secrets still usable; each demo tenant without one has its demo key
    revoked, so that ``seed_demo`` issues a new one (a secret is shown only once: a key
    whose secret is lost can only be replaced)."""
    from shunter.project.management.commands.seed_demo import KEY_NAME, TENANTS
    from shunter.tenants import services as tenant_services
    from shunter.tenants.keys import secret_digest
    from shunter.tenants.models import ApiKey

    usable: dict[str, str] = {}
    for tenant, _, _ in TENANTS:
        keys = ApiKey.objects.usable().filter(tenant__name=tenant, name=KEY_NAME)
        secret = known.get(tenant)
        if secret is not None and keys.filter(digest=secret_digest(secret)).exists():
            usable[tenant] = secret
            continue
        for key in keys:
            tenant_services.api_key_revoke(api_key=key)
    return usable


@dataclass(frozen=True)
class Prepared:
    """What ``prepare`` set up: the node's id and each tenant's key secret."""

    node_id: int
    secrets: dict[str, str]


def prepare(
    *, paths: DemoPaths, model_dirs: dict[str, Path], engine: EngineProcess | None
) -> Prepared:
    """Register the demo (``seed_demo``, idempotent), point its node at ``engine`` (its
    URL, token and HBM; reconciled and polled once) and keep the tenants' keys in
    ``paths.keys``. Without an engine (``--no-serve``) the rows are registered and
    nothing is called."""
    from shunter.platform import services
    from shunter.platform.models import Model, Node
    from shunter.project.management.commands.seed_demo import seed_demo

    known = _drop_unknown_keys(_read_keys(paths.keys))
    seeded = seed_demo(
        engine_url=engine.url if engine else "http://127.0.0.1:8100",
        engine_token=engine.token if engine else "",
        llama_dir=str(model_dirs["tiny-llama"]),
        qwen_dir=str(model_dirs["tiny-qwen2"]),
        hbm_bytes=HBM_BUDGET,
    )
    for name, path in model_dirs.items():
        model = Model.objects.get(name=name)
        if model.source_dir != str(path):  # the var dir moved since the first run
            services.model_update(model=model, source_dir=str(path))
    node = Node.objects.get(name="demo")
    if engine is not None:
        node = services.node_update(
            node=node, engine_url=engine.url, engine_token=engine.token, hbm_bytes=HBM_BUDGET
        )
        reconciled = services.node_reconcile(node=node)
        if not reconciled.ok:
            raise DemoError(f"the engine refused the demo deployments: {reconciled.error}")
        if not services.node_poll(node=node).healthy:
            raise DemoError(f"the engine stopped answering: {node.last_error}")
    keys = {**known, **seeded.secrets}
    models = {stream.tenant: stream.model for stream in LOAD}
    write_private(
        paths.keys,
        json.dumps(
            {tenant: {"key": key, "model": models.get(tenant)} for tenant, key in keys.items()},
            indent=2,
        )
        + "\n",
    )
    return Prepared(node_id=node.pk, secrets=keys)


def use_wal(database: str = "default") -> None:
    """Put an SQLite database in write-ahead-log mode (kept in the file): the console's
    readers then never block the gateway's record writes, nor the poller's."""
    from django.db import connections

    connection = connections[database]
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")
