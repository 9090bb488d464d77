"""Rows the platform and tenants tests build on, made through the services."""

from __future__ import annotations

import itertools
from typing import Any

from shunter.platform.models import Deployment, Model, Node, SloClass
from shunter.tenants.models import Tenant
from shunter.tenants.services import tenant_create

GIB = 1024**3
_seq = itertools.count()


def tiny_config(**overrides: Any) -> dict[str, Any]:
    """A small Llama config.json (float32, 2 layers)."""
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "torch_dtype": "float32",
    }
    config.update(overrides)
    return config


def make_node(*, hbm_bytes: int = 80 * GIB, **fields: Any) -> Node:
    n = next(_seq)
    node = Node(
        name=fields.pop("name", f"node-{n}"),
        engine_url=fields.pop("engine_url", f"http://127.0.0.1:{20000 + n}"),
        hbm_bytes=hbm_bytes,
        **fields,
    )
    node.save()
    return node


def make_model(*, name: str | None = None, **overrides: Any) -> Model:
    config = tiny_config(**overrides)
    spec_name = name or f"model-{next(_seq)}"
    model = Model(name=spec_name, source_dir=f"/models/{spec_name}", config=config)
    spec = model.spec()
    model.architecture = config["model_type"]
    model.num_layers = spec.num_layers
    model.param_bytes = spec.param_bytes
    model.kv_bytes_per_token = spec.kv_bytes_per_token
    model.context_length = spec.max_context
    model.save()
    return model


def slo(name: str = "standard") -> SloClass:
    return SloClass.objects.get(name=name)


def make_deployment(
    *, node: Node | None = None, model: Model | None = None, **fields: Any
) -> Deployment:
    deployment = Deployment(
        node=node or make_node(),
        model=model or make_model(),
        slo_class=fields.pop("slo_class", None) or slo(),
        **fields,
    )
    deployment.save()
    return deployment


def make_tenant(
    *deployments: Deployment, slo_name: str | None = "standard", **quotas: Any
) -> Tenant:
    """A tenant of class ``slo_name`` (None: its requests take each deployment's)."""
    return tenant_create(
        name=quotas.pop("name", f"tenant-{next(_seq)}"),
        default_slo_class=slo(slo_name) if slo_name is not None else None,
        deployments=deployments,
        **quotas,
    )
