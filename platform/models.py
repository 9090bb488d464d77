"""What an operator registers: SLO classes, GPU nodes, models, and deployments of models
on nodes. Behaviour lives in ``services`` (writes) and ``selectors`` (reads); the models
hold data and the facts derived from it."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Self
from urllib.parse import urlsplit

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from shunter.common.db import TenantScopedQuerySet
from shunter.engine.api.deployments import LIMIT_KEYS, ModelEntry, SloEntry
from shunter.engine.api.headers import slo_to_header
from shunter.engine.api.tokens import TOKEN_PATTERN, TOKEN_RULE
from shunter.engine.config import ModelSpec, SloSpec
from shunter.engine.exec.hf_config import model_spec_from_config

# A served model name is a path segment of /models/<name>/v1/ and the OpenAI "model" field.
served_name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z",
    "Use letters, digits, '.', '_' and '-', starting with a letter or digit.",
)


def validate_no_nul(value: Any) -> None:
    """PostgreSQL text and JSON cannot hold a NUL character anywhere."""
    text = value if isinstance(value, str) else json.dumps(value)
    if "\x00" in text or "\\u0000" in text:
        raise ValidationError("NUL characters are not allowed.")


class DeploymentQuerySet(TenantScopedQuerySet):
    """A deployment "belongs" to every tenant allowed to use it: each tenant granted the
    deployment itself (pinned to its node) or its model (every deployment of the model,
    now and later)."""

    def restrict(self, tenant: Any) -> Self:
        """The deployments ``tenant`` (a Tenant, its id or an ``OuterRef``) may use, each
        once; None leaves them all."""
        if tenant is None:
            return self
        return self.filter(models.Q(tenants=tenant) | models.Q(model__tenants=tenant)).distinct()


class SloClass(models.Model):
    """A latency objective: TTFT (S_F) and TBT (S_B) targets in milliseconds, the Virtual
    Lag Time weights of its requests, and the share of requests that should meet both."""

    name = models.SlugField(max_length=64, unique=True)
    ttft_ms = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    tbt_ms = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    alpha = models.FloatField(default=3.0, validators=[MinValueValidator(0.0)])
    beta_b = models.FloatField(default=0.0, validators=[MinValueValidator(0.0)])
    beta_f = models.FloatField(default=0.5, validators=[MinValueValidator(0.0)])
    attainment_target = models.FloatField(
        default=0.9, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )

    class Meta:
        ordering = ["ttft_ms", "name"]
        verbose_name = "SLO class"
        verbose_name_plural = "SLO classes"

    def __str__(self) -> str:
        return f"{self.name} ({self.ttft_ms} ms / {self.tbt_ms} ms)"

    def spec(self) -> SloSpec:
        """The engine's view of this class."""
        return SloSpec(
            self.name,
            ttft_s=self.ttft_ms / 1000,
            tbt_s=self.tbt_ms / 1000,
            alpha=self.alpha,
            beta_b=self.beta_b,
            beta_f=self.beta_f,
        )

    def header(self) -> str:
        """This class as the gateway tells the engine (``X-Shunter-Slo``): its targets
        and VLT weights, the floats in general form to 12 digits (``0.5``, ``3``)."""
        return slo_to_header(self.spec())

    def engine_table(self) -> SloEntry:
        """This class as the engine's settings spell it (``slo_classes.<name>``)."""
        return SloEntry(self.ttft_ms, self.tbt_ms, self.alpha, self.beta_b, self.beta_f)


# The engine's own rule (``engine.api.tokens``): the token goes in an HTTP header.
engine_token_validator = RegexValidator(
    TOKEN_PATTERN, f"Use {TOKEN_RULE}.", code="invalid_engine_token"
)

ENGINE_TOKEN_PURPOSE = b"shunter.platform.Node.engine_token:"
BENCHMARK_KEY_PURPOSE = b"shunter.platform.BenchmarkJob.api_key:"


def _cipher(purpose: bytes) -> Fernet:
    # A key of its own per purpose, derived from SECRET_KEY: rotating SECRET_KEY makes
    # stored secrets unreadable, and the admin then sets them again.
    digest = hashlib.sha256(purpose + settings.SECRET_KEY.encode())
    return Fernet(base64.urlsafe_b64encode(digest.digest()))


def encrypt_secret(purpose: bytes, secret: str) -> str:
    """``secret`` as stored for ``purpose`` ('' stays '': no secret)."""
    return _cipher(purpose).encrypt(secret.encode()).decode() if secret else ""


def decrypt_secret(purpose: bytes, stored: str) -> str:
    """The secret ``stored`` holds: '' when none is stored or it cannot be read (e.g.
    after SECRET_KEY changed)."""
    if not stored:
        return ""
    try:
        return _cipher(purpose).decrypt(stored.encode()).decode()
    except InvalidToken:
        return ""


class Node(models.Model):
    """A GPU host and the one engine process that serves all of its deployments.

    The engine's bearer token is stored encrypted (``set_engine_token`` /
    ``engine_token``); ``state`` caches the engine's last ``/admin/state`` snapshot and
    ``engine_started`` the start time its ``/v1/models`` reports (a change means it
    restarted).

    ``cordon`` says why the node takes no new requests ('' when it is in rotation): an
    operator cordoned it (for maintenance), or a rollout did while it changes the node's
    deployments. The gateway routes no new request to a cordoned node; the ones in
    flight finish.
    """

    class Status(models.TextChoices):
        UNKNOWN = "unknown"
        HEALTHY = "healthy"
        UNHEALTHY = "unhealthy"

    class Cordon(models.TextChoices):
        NONE = "", "in rotation"
        OPERATOR = "operator", "cordoned by an operator"
        ROLLOUT = "rollout", "cordoned while its deployments change"

    name = models.SlugField(max_length=64, unique=True)
    engine_url = models.URLField(max_length=500)
    engine_token_encrypted = models.TextField(blank=True, default="", editable=False)
    hardware_profile = models.JSONField(default=dict, blank=True, validators=[validate_no_nul])
    hbm_bytes = models.PositiveBigIntegerField(validators=[MinValueValidator(1)])
    dram_bytes = models.PositiveBigIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.UNKNOWN)
    cordon = models.CharField(
        max_length=16, choices=Cordon.choices, blank=True, default=Cordon.NONE, editable=False
    )
    last_seen = models.DateTimeField(null=True, blank=True)
    state = models.JSONField(default=dict, blank=True)
    state_at = models.DateTimeField(null=True, blank=True)
    engine_started = models.BigIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def set_engine_token(self, token: str) -> None:
        """Store ``token`` encrypted (empty: the engine runs without a token). A token
        that cannot go in an HTTP header is a ValidationError on ``engine_token``."""
        try:
            engine_token_validator(token)
        except ValidationError as e:
            raise ValidationError({"engine_token": e.error_list}) from None
        self.engine_token_encrypted = encrypt_secret(ENGINE_TOKEN_PURPOSE, token)

    def engine_token(self) -> str:
        """The engine token in clear text ('' when none is set or it cannot be read,
        e.g. after SECRET_KEY changed)."""
        return decrypt_secret(ENGINE_TOKEN_PURPOSE, self.engine_token_encrypted)

    @property
    def has_engine_token(self) -> bool:
        return bool(self.engine_token_encrypted)

    @property
    def cordoned(self) -> bool:
        return self.cordon != self.Cordon.NONE


# The node statuses the gateway routes new requests to: up, or not polled yet.
ROUTABLE_STATUSES = (Node.Status.HEALTHY, Node.Status.UNKNOWN)
# How long a gateway serves a route table it read: a cordon or a status change reaches
# every gateway within it (the drain-first change waits for it).
ROUTES_CACHE_S = 2.0


class Model(models.Model):
    """A model directory served under ``name``, with the architecture facts its
    ``config.json`` gives (``services.model_facts`` reads them)."""

    name = models.CharField(max_length=128, unique=True, validators=[served_name_validator])
    source_dir = models.CharField(max_length=1000, validators=[validate_no_nul])
    architecture = models.CharField(max_length=64)
    num_layers = models.PositiveIntegerField()
    param_bytes = models.PositiveBigIntegerField()
    kv_bytes_per_token = models.PositiveBigIntegerField()
    context_length = models.PositiveIntegerField()
    config = models.JSONField(default=dict)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def spec(self) -> ModelSpec:
        """The engine's ModelSpec of the stored config (sizes per layer and in all)."""
        return model_spec_from_config(self.config, self.name)


class Deployment(models.Model):
    """A model served on a node: its sharing mode, the SLO class and priority of its
    requests, KV bounds, the longest context accepted, whether its tenants share cached
    prompt prefixes, and whether it is served."""

    class Sharing(models.TextChoices):
        TEMPORAL = "temporal"
        SPATIAL = "spatial"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="deployments")
    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="deployments")
    sharing = models.CharField(max_length=16, choices=Sharing.choices, default=Sharing.SPATIAL)
    slo_class = models.ForeignKey(SloClass, on_delete=models.PROTECT, related_name="deployments")
    priority = models.IntegerField(default=0)
    kv_floor_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    kv_ceiling_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    max_context = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    share_prefixes = models.BooleanField(
        default=False,
        help_text="Let the prefix cache serve one tenant's cached prompts to another "
        "(off: each tenant's are its own, since how fast a prompt is answered could tell "
        "a tenant what another sent).",
    )
    enabled = models.BooleanField(default=True)

    objects = DeploymentQuerySet.as_manager()

    class Meta:
        ordering = ["node__name", "-priority", "model__name"]
        constraints = [
            models.UniqueConstraint(fields=["node", "model"], name="deployment_unique_node_model")
        ]

    def __str__(self) -> str:
        return f"{self.model.name} on {self.node.name}"

    @property
    def served_name(self) -> str:
        """The name clients address it by (the model's)."""
        return self.model.name

    def context_tokens(self) -> int:
        """The longest context it accepts: ``max_context`` or the model's own."""
        return self.max_context or self.model.context_length

    def engine_entry(self) -> dict[str, Any]:
        """This deployment as a model entry of the engine's ``PUT /admin/deployments``:
        the KV bounds (bytes) and the longest context (tokens) only when they are set."""
        return self.model_entry().to_json()

    def model_entry(self) -> ModelEntry:
        return ModelEntry(
            name=self.model.name,
            path=self.model.source_dir,
            sharing=self.sharing,
            priority=self.priority,
            slo=self.slo_class.name,
            share_prefixes=self.share_prefixes,
            **self.engine_limits(),
        )

    def engine_limits(self) -> dict[str, int | None]:
        """The limits as the engine names them (``/admin/state`` reports the same keys,
        null when unset)."""
        values = (self.kv_floor_bytes, self.kv_ceiling_bytes, self.max_context)
        return dict(zip(LIMIT_KEYS, values, strict=True))


# -- benchmark jobs ------------------------------------------------------------------------
def validate_rates(value: Any) -> None:
    """A non-empty list of positive, finite request rates (requests per second)."""
    if not isinstance(value, list) or not value:
        raise ValidationError("Give a list of request rates, e.g. [1, 2, 4].")
    for rate in value:
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < 1e6:
            raise ValidationError(f"{rate!r} is not a request rate (a positive number of req/s).")


def validate_base_url(value: str) -> None:
    """An http(s) URL with a host; single-label hosts (``http://vllm:8000``, a compose
    service) are fine, unlike Django's URLValidator."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValidationError("Enter an http:// or https:// URL.") from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(c.isspace() or c == "\x00" for c in value)
    ):
        raise ValidationError("Enter an http:// or https:// URL with a host.")


class BenchmarkJob(models.Model):
    """A load test of one target at a list of request rates, run on demand or on a
    schedule (a django-celery-beat ``PeriodicTask`` the services keep in step).

    Targets (``target_kind``):

    - ``deployment``: through the gateway at ``base_url``, as a benchmark tenant with a
      key made for each run (revoked when it ends);
    - ``engine``: a node's engine directly, with the node's engine token;
    - ``url``: any OpenAI-compatible server (e.g. vLLM) with ``api_key`` (stored
      encrypted, write-only);
    - ``simulator``: the engine core on simulated hardware, ``simulator`` naming a
      catalog model, hardware and policies, or one of the paper's scenarios. Its runs
      are labelled simulated.

    Each rate sends ``num_requests`` requests or ``duration_s`` seconds of arrivals
    (gamma gaps of shape ``burstiness``; 1 is Poisson). Requests are scored against
    ``slo_class`` or the explicit ``ttft_slo_ms`` / ``tpot_slo_ms`` (a deployment's own
    class when neither is given).
    """

    class TargetKind(models.TextChoices):
        DEPLOYMENT = "deployment"
        ENGINE = "engine"
        URL = "url"
        SIMULATOR = "simulator"

    class WorkloadKind(models.TextChoices):
        SYNTHETIC = "synthetic"
        SHAREGPT = "sharegpt"
        TRACE = "trace"

    class Endpoint(models.TextChoices):
        COMPLETIONS = "completions"
        CHAT = "chat"

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True, default="", validators=[validate_no_nul])
    target_kind = models.CharField(max_length=16, choices=TargetKind.choices)
    deployment = models.ForeignKey(
        Deployment,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="benchmark_jobs",
    )
    node = models.ForeignKey(
        Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="benchmark_jobs"
    )
    base_url = models.CharField(
        max_length=500, blank=True, default="", validators=[validate_base_url]
    )
    api_key_encrypted = models.TextField(blank=True, default="", editable=False)
    model_name = models.CharField(
        max_length=128, blank=True, default="", validators=[validate_no_nul]
    )
    endpoint = models.CharField(max_length=16, choices=Endpoint.choices, default="completions")
    simulator = models.JSONField(default=dict, blank=True, validators=[validate_no_nul])
    workload_kind = models.CharField(
        max_length=16, choices=WorkloadKind.choices, default=WorkloadKind.SYNTHETIC
    )
    input_len = models.CharField(max_length=32, default="128", validators=[validate_no_nul])
    output_len = models.CharField(max_length=32, default="128", validators=[validate_no_nul])
    dataset_path = models.CharField(
        max_length=1000, blank=True, default="", validators=[validate_no_nul]
    )
    burstiness = models.FloatField(default=1.0, validators=[MinValueValidator(1e-3)])
    rates = models.JSONField(default=list, validators=[validate_rates])
    duration_s = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.1), MaxValueValidator(86400)]
    )
    num_requests = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(1_000_000)]
    )
    max_concurrency = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100_000)]
    )
    seed = models.IntegerField(default=0, validators=[MinValueValidator(0)])
    slo_class = models.ForeignKey(
        SloClass, on_delete=models.PROTECT, null=True, blank=True, related_name="benchmark_jobs"
    )
    ttft_slo_ms = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0.001)])
    tpot_slo_ms = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0.001)])
    request_timeout_s = models.FloatField(
        default=120.0, validators=[MinValueValidator(0.1), MaxValueValidator(86400)]
    )
    timeout_s = models.FloatField(
        default=3600.0, validators=[MinValueValidator(1.0), MaxValueValidator(7 * 86400)]
    )
    schedule_every_s = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(366 * 86400)]
    )
    schedule_crontab = models.CharField(
        max_length=100, blank=True, default="", validators=[validate_no_nul]
    )
    periodic_task = models.OneToOneField(
        "django_celery_beat.PeriodicTask",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        editable=False,
        related_name="benchmark_job",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def set_api_key(self, key: str) -> None:
        """Store the ``url`` target's key encrypted ('' clears it)."""
        self.api_key_encrypted = encrypt_secret(BENCHMARK_KEY_PURPOSE, key)

    def api_key(self) -> str:
        """The ``url`` target's key in clear text ('' when none or unreadable)."""
        return decrypt_secret(BENCHMARK_KEY_PURPOSE, self.api_key_encrypted)

    @property
    def has_api_key(self) -> bool:
        return bool(self.api_key_encrypted)

    @property
    def is_scheduled(self) -> bool:
        return self.schedule_every_s is not None or bool(self.schedule_crontab)


class BenchmarkRun(models.Model):
    """One execution of a job: its status and times, the job's settings as they were
    (``config``, no secrets), ``results`` (one object per series and rate with the load
    generator's vLLM-named fields, see ``shunter.engine.loadgen.report.RateReport``),
    the per-request CSV file under the var directory, and the error if it failed.

    ``key`` names the run to the task queue (ids repeat across databases, keys do not);
    ``lock_key`` is the target it holds or waits for, one run per target at a time.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    class Trigger(models.TextChoices):
        MANUAL = "manual"
        SCHEDULE = "schedule"

    FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    key = models.UUIDField(unique=True, editable=False)
    job = models.ForeignKey(BenchmarkJob, on_delete=models.CASCADE, related_name="runs")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.MANUAL)
    target_label = models.CharField(max_length=300, blank=True, default="")
    lock_key = models.CharField(max_length=600, blank=True, default="")
    simulated = models.BooleanField(default=False)
    config = models.JSONField(default=dict, blank=True)
    results = models.JSONField(default=list, blank=True)
    requests_csv = models.CharField(max_length=1000, blank=True, default="")
    error = models.TextField(blank=True, default="")
    cancel_requested = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["job", "-created_at"], name="benchmarkrun_job_created")]

    def __str__(self) -> str:
        return f"{self.job.name} #{self.pk} ({self.status})"

    @property
    def finished(self) -> bool:
        return self.status in self.FINISHED
