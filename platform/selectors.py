"""Read operations of the platform app (selectors): querysets with what their callers
need joined in, so lists cost a fixed number of queries."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import QuerySet

from shunter.platform.models import ROUTABLE_STATUSES, Deployment, Model, Node, SloClass


def slo_class_list() -> QuerySet[SloClass]:
    return SloClass.objects.all()


def node_list() -> QuerySet[Node]:
    return Node.objects.all()


def model_list() -> QuerySet[Model]:
    return Model.objects.all()


def deployment_list() -> QuerySet[Deployment]:
    """Deployments with their node, model and SLO class."""
    return Deployment.objects.select_related("node", "model", "slo_class")


def node_desired_deployments(*, node: Node) -> list[Deployment]:
    """What ``node``'s engine should serve: its enabled deployments, highest priority
    first, with model and SLO class loaded."""
    return list(
        deployment_list().filter(node_id=node.pk, enabled=True).order_by("-priority", "model__name")
    )


def deployment_by_served_name(name: str) -> Deployment | None:
    """The enabled deployment clients address as ``name`` (a model is served on at most
    one node at a time here: the first by node name when several exist)."""
    return deployment_list().filter(model__name=name, enabled=True).order_by("node__name").first()


def models_without_other_replica(*, node: Node, model_names: Iterable[str]) -> list[str]:
    """Those of ``model_names`` that no enabled deployment on another routable node
    (up or not polled yet, not cordoned) serves: taking ``node`` out of rotation would
    leave them unserved."""
    names = set(model_names)
    elsewhere = set(
        Deployment.objects.filter(
            model__name__in=names,
            enabled=True,
            node__status__in=ROUTABLE_STATUSES,
            node__cordon=Node.Cordon.NONE,
        )
        .exclude(node_id=node.pk)
        .values_list("model__name", flat=True)
    )
    return sorted(names - elsewhere)
