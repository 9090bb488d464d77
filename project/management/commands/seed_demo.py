"""``shunter manage seed_demo``: a demo node (the local engine), two tiny models, one
temporal and one spatial deployment, two tenants of different SLO classes and a key
each. Idempotent: a second run changes nothing and creates no second key.

The model directories come from ``shunter model init --preset tiny-llama|tiny-qwen2
--out DIR``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from shunter.platform import services
from shunter.platform.models import Deployment, Model, Node, SloClass
from shunter.tenants import services as tenant_services
from shunter.tenants.models import ApiKey, Tenant

GIB = 1024**3
# name, SLO class, the served models it may use
TENANTS = (
    ("demo-chat", "interactive", ("tiny-llama", "tiny-qwen2")),
    ("demo-batch", "batch", ("tiny-qwen2",)),
)
KEY_NAME = "demo"


@dataclass
class Seeded:
    """What a run created; ``secrets`` maps tenant name to a new key's secret."""

    created: list[str] = field(default_factory=list)
    secrets: dict[str, str] = field(default_factory=dict)


@transaction.atomic
def seed_demo(
    *,
    engine_url: str,
    engine_token: str,
    llama_dir: str,
    qwen_dir: str,
    hbm_bytes: int,
    node_name: str = "demo",
) -> Seeded:
    """Register the demo rows that do not exist yet (by name)."""
    seeded = Seeded()
    node = Node.objects.filter(name=node_name).first()
    if node is None:
        node = services.node_create(
            name=node_name,
            engine_url=engine_url,
            engine_token=engine_token,
            hbm_bytes=hbm_bytes,
            hardware_profile={"device": "local"},
        )
        seeded.created.append(f"node {node_name}")
    models: dict[str, Model] = {}
    for name, source_dir in (("tiny-llama", llama_dir), ("tiny-qwen2", qwen_dir)):
        model = Model.objects.filter(name=name).first()
        if model is None:
            model = services.model_create(name=name, source_dir=source_dir)
            seeded.created.append(f"model {name}")
        models[name] = model
    deployments: dict[str, Deployment] = {}
    for name, sharing, slo, priority in (
        ("tiny-llama", "temporal", "interactive", 1),
        ("tiny-qwen2", "spatial", "standard", 0),
    ):
        deployment = Deployment.objects.filter(node=node, model=models[name]).first()
        if deployment is None:
            deployment = services.deployment_create(
                node=node,
                model=models[name],
                slo_class=SloClass.objects.get(name=slo),
                sharing=sharing,
                priority=priority,
            )
            seeded.created.append(f"deployment {name} ({sharing})")
        deployments[name] = deployment
    for tenant_name, slo, allowed in TENANTS:
        tenant = Tenant.objects.filter(name=tenant_name).first()
        if tenant is None:
            tenant = tenant_services.tenant_create(
                name=tenant_name,
                default_slo_class=SloClass.objects.get(name=slo),
                deployments=[deployments[n] for n in allowed],
                rpm_limit=600,
            )
            seeded.created.append(f"tenant {tenant_name}")
        if not ApiKey.objects.usable().restrict(tenant).filter(name=KEY_NAME).exists():
            _, secret = tenant_services.api_key_create(
                tenant=tenant, name=KEY_NAME, all_deployments=True
            )
            seeded.secrets[tenant_name] = secret
    return seeded


class Command(BaseCommand):
    help = "Register a demo node, two tiny models, their deployments, two tenants and keys."

    def add_arguments(self, parser: CommandParser) -> None:
        env = os.environ.get
        parser.add_argument(
            "--engine-url", default=env("SHUNTER_ENGINE_URL", "http://127.0.0.1:8100")
        )
        parser.add_argument(
            "--engine-token",
            default=env("SHUNTER_ENGINE_TOKEN", ""),
            help="the engine's bearer token (default: $SHUNTER_ENGINE_TOKEN)",
        )
        parser.add_argument("--llama-dir", default=env("SHUNTER_DEMO_LLAMA_DIR"))
        parser.add_argument("--qwen-dir", default=env("SHUNTER_DEMO_QWEN_DIR"))
        parser.add_argument("--hbm-bytes", type=int, default=8 * GIB)
        parser.add_argument("--node-name", default="demo")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["llama_dir"] or not options["qwen_dir"]:
            raise CommandError(
                "give --llama-dir and --qwen-dir (made by `shunter model init --preset "
                "tiny-llama|tiny-qwen2 --out DIR`)"
            )
        try:
            seeded = seed_demo(
                engine_url=options["engine_url"],
                engine_token=options["engine_token"],
                llama_dir=options["llama_dir"],
                qwen_dir=options["qwen_dir"],
                hbm_bytes=options["hbm_bytes"],
                node_name=options["node_name"],
            )
        except ValidationError as e:
            raise CommandError("; ".join(e.messages)) from None
        for line in seeded.created:
            self.stdout.write(f"created {line}")
        if not seeded.created and not seeded.secrets:
            self.stdout.write("the demo is already registered; nothing changed")
        for tenant, secret in seeded.secrets.items():
            self.stdout.write(f"key of {tenant}: {secret}  (shown once; it is not stored)")
