"""Frozen configuration dataclasses of the engine. Pure logic: no torch."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts of one decoder-only transformer, enough to size and time it.

    ``num_experts == 0`` means a dense MLP; otherwise each token runs
    ``num_active_experts`` of ``num_experts`` expert MLPs (Mixtral-style MoE).
    ``mlp_gated`` is True for SwiGLU MLPs (three matrices, Llama/Qwen/Mistral) and
    False for two-matrix MLPs (OPT). ``qk_norm`` (Qwen3) adds a query and a key norm of
    ``head_dim`` weights to each layer.
    """

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2
    num_experts: int = 0
    num_active_experts: int = 0
    mlp_gated: bool = True
    tie_embeddings: bool = False
    max_context: int = 4096
    qk_norm: bool = False

    def __post_init__(self) -> None:
        for field in (
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "hidden_size",
            "intermediate_size",
            "vocab_size",
            "dtype_bytes",
            "max_context",
        ):
            if getattr(self, field) <= 0:
                raise ValueError(f"ModelSpec {self.name!r}: {field} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelSpec {self.name!r}: num_heads ({self.num_heads}) must be a multiple "
                f"of num_kv_heads ({self.num_kv_heads})"
            )
        if self.num_experts < 0 or not 0 <= self.num_active_experts <= self.num_experts:
            raise ValueError(
                f"ModelSpec {self.name!r}: need 0 <= num_active_experts <= num_experts"
            )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @cached_property
    def attention_params(self) -> int:
        """Parameters of one layer's attention: q, k, v and output projections."""
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        return self.hidden_size * (q_out + 2 * kv_out) + q_out * self.hidden_size

    @cached_property
    def expert_params(self) -> int:
        """Parameters of one MLP (one expert for MoE models)."""
        matrices = 3 if self.mlp_gated else 2
        return matrices * self.hidden_size * self.intermediate_size

    @cached_property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (all experts, norms and router included)."""
        experts = max(self.num_experts, 1)
        router = self.hidden_size * self.num_experts
        return self.attention_params + experts * self.expert_params + router + self.norm_params

    @cached_property
    def active_layer_params(self) -> int:
        """Parameters one token touches in one layer (active experts only)."""
        experts = self.num_active_experts if self.is_moe else 1
        return self.attention_params + experts * self.expert_params + self.norm_params

    @property
    def norm_params(self) -> int:
        """A layer's two RMSNorms, and its query and key norms where it has them."""
        return 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)

    @cached_property
    def embedding_params(self) -> int:
        """Input embedding plus the output head (once if tied) plus the final norm."""
        heads = 1 if self.tie_embeddings else 2
        return heads * self.vocab_size * self.hidden_size + self.hidden_size

    @cached_property
    def num_params(self) -> int:
        return self.num_layers * self.layer_params + self.embedding_params

    @cached_property
    def layer_bytes(self) -> int:
        return self.layer_params * self.dtype_bytes

    @cached_property
    def param_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @cached_property
    def kv_bytes_per_token_layer(self) -> int:
        """K and V of one token in one layer."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across all layers."""
        return self.num_layers * self.kv_bytes_per_token_layer

    def block_bytes(self, block_tokens: int) -> int:
        """Bytes of one block-first KV block: ``[layer, k|v, token, kv_head, head_dim]``."""
        return block_tokens * self.kv_bytes_per_token


@dataclass(frozen=True)
class SloSpec:
    """An SLO class: targets and the Virtual Lag Time parameters of its requests.

    ``ttft_s`` is S_F and ``tbt_s`` is S_B in the VLT formula; ``beta_f`` scales the
    TTFT target for waiting requests, ``beta_b`` the TBT target for rotary ones, and
    ``alpha`` weighs rotary lag against waiting lag.
    """

    name: str
    ttft_s: float
    tbt_s: float
    alpha: float = 3.0
    beta_b: float = 0.0
    beta_f: float = 0.5

    def __post_init__(self) -> None:
        if self.ttft_s <= 0 or self.tbt_s <= 0:
            raise ValueError(f"SLO class {self.name!r}: targets must be positive")
        if self.alpha < 0 or self.beta_b < 0 or self.beta_f < 0:
            raise ValueError(f"SLO class {self.name!r}: alpha and betas must be >= 0")


POLICIES = ("fcfs", "wf", "sf", "lvf", "lvf+", "lvf+shed")
PREEMPTION_MODES = ("swap", "recompute")
SHARING_MODES = ("spatial", "temporal")
CAPACITY_SOURCES = ("free", "inactive", "rotation", "active")


# The papers' default SLOs (5 s TTFT, 100 ms TBT).
DEFAULT_SLO = SloSpec("default", ttft_s=5.0, tbt_s=0.1)


@dataclass(frozen=True)
class TenantSpec:
    """One model's tenancy: ``sharing`` mode, ``slo`` (the default class of its
    requests), ``priority`` (higher runs first and loses layers last), and KV bounds in
    bytes: ``kv_floor`` is kept for it alone (a temporal model's only while it holds
    the turn or none does, where the policy rotates: ``KVMemory.suspend_floors``),
    ``kv_ceiling`` (None: no bound) caps it.

    Spatial models execute in every step in which they have work; temporal models take
    turns (see ``sched.tenancy``).
    """

    model: str
    sharing: str = "spatial"
    slo: SloSpec | None = None
    priority: int = 0
    kv_floor: int = 0
    kv_ceiling: int | None = None

    def __post_init__(self) -> None:
        if self.sharing not in SHARING_MODES:
            raise ValueError(f"tenant {self.model!r}: sharing must be one of {SHARING_MODES}")
        if self.kv_floor < 0 or (self.kv_ceiling is not None and self.kv_ceiling < self.kv_floor):
            raise ValueError(f"tenant {self.model!r}: need 0 <= kv_floor <= kv_ceiling")


# A decode waits behind at most one step, and its token gap also holds the rest of the
# engine's round (scheduling, sampling, delivery): half the tightest TBT target for the
# step leaves the other half for those and for a swap-in's wait.
STEP_TARGET_TBT_FRACTION = 0.5
# Without SLO classes: 100 ms, about where a stream's pauses start to show to a reader,
# while a chunk still amortizes the step's fixed cost over many tokens.
DEFAULT_STEP_TARGET_S = 0.1


def default_step_target_s(slos: Iterable[SloSpec | None]) -> float:
    """The time a step should take for models of these SLO classes: a fraction of the
    tightest TBT target, else a default (what an engine runs with unless told)."""
    tbts = [slo.tbt_s for slo in slos if slo is not None]
    return STEP_TARGET_TBT_FRACTION * min(tbts) if tbts else DEFAULT_STEP_TARGET_S


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs of the step scheduler.

    ``policy`` picks who runs: ``fcfs`` (vLLM-like passive preemption), ``wf``
    (waiting-first), ``sf`` (swapped-first), ``lvf`` (RotaSched's Largest-VLT-First,
    Algorithm 1 as the paper has it) or ``lvf+`` (the default: LVF that rotates only
    where memory binds and the rotated request's TBT slack covers its time out).
    ``xfer_budget_blocks`` is B_xfer, the blocks LVF may rotate per step (paper: 2400).
    ``max_batch_tokens`` is the per-step token budget shared by decodes and prefill
    chunks; ``max_running`` caps concurrently running requests (vLLM's max_num_seqs).
    ``preemption`` is what a preempted request's KV becomes: ``swap`` (copied to host
    memory when it has computed KV and swap space is free; it resumes as ROTARY) or
    ``recompute`` (freed; it waits again and recomputes its context, as vLLM's V1
    engine does). ``turn_quantum_s`` is the least time a temporal model holds the turn
    while it has work. With ``step_target_s`` the tokens of a step are bounded further by
    a ``StepBudget``: as many as the measured step cost says fit in that many seconds.
    Decodes and prompts split it max-min fairly, decodes beyond their share waiting a
    step (the most TBT slack first), so one long prompt is chunked over several steps
    and a fan-out of hundreds of sequences decodes over several, instead of holding
    every other request for one long step; and a light model's first token goes first
    (``sched.first_tokens``). None (the default, and the
    simulator's) keeps the fixed budget.
    ``link_bytes_per_s`` is the host link's rate in one direction where it is known (the
    simulator's profile, a measured one): ``lvf+`` counts its KV's round trip over it
    in what a rotation costs a request (with the step it sits out), and keeps a request
    running at least k times that. None: the step alone.
    ``chunked_prefill`` False schedules as vLLM's V0 engine does without chunked prefill
    (its default for contexts up to 32K tokens): a model's step runs either prompts or
    decodes, prompts first, each prompt whole, at most one context of the model (and
    ``max_batch_tokens``) a step, so a request that could outgrow that is refused; its
    decodes wait while it prefills. Not with ``step_target_s``, which chunks prompts.
    The simulator's Oneiros check uses it for vLLM v0.7.3, the baseline Oneiros is
    built into.
    """

    policy: str = "lvf+"
    xfer_budget_blocks: int = 2400
    max_batch_tokens: int = 8192
    max_running: int = 256
    turn_quantum_s: float = 0.5
    step_target_s: float | None = None
    preemption: str = "swap"
    link_bytes_per_s: float | None = None
    chunked_prefill: bool = True

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose from {POLICIES}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(
                f"unknown preemption {self.preemption!r}; choose from {PREEMPTION_MODES}"
            )
        if self.xfer_budget_blocks < 0:
            raise ValueError("xfer_budget_blocks must be >= 0")
        if self.max_batch_tokens <= 0 or self.max_running <= 0:
            raise ValueError("max_batch_tokens and max_running must be positive")
        if self.turn_quantum_s < 0:
            raise ValueError("turn_quantum_s must be >= 0")
        if self.link_bytes_per_s is not None and self.link_bytes_per_s <= 0:
            raise ValueError("link_bytes_per_s must be positive")
        if self.step_target_s is not None and self.step_target_s <= 0:
            raise ValueError("step_target_s must be positive")
        if self.step_target_s is not None and not self.chunked_prefill:
            raise ValueError("step_target_s chunks prompts: it needs chunked_prefill")


@dataclass(frozen=True)
class RotationConfig:
    """DuplexKV's eager block rotation.

    When ``eager`` is on and a model's device KV is at least ``watermark`` full, up to
    ``budget_blocks`` newly SYNCED blocks per step are copied to host ahead of any
    preemption. Below the watermark nothing is copied: memory that never runs out costs
    no transfers.
    """

    eager: bool = True
    budget_blocks: int = 1024
    watermark: float = 0.8

    def __post_init__(self) -> None:
        if self.budget_blocks < 0:
            raise ValueError("rotation budget_blocks must be >= 0")
        if not 0.0 <= self.watermark <= 1.0:
            raise ValueError("rotation watermark must be in [0, 1]")


@dataclass(frozen=True)
class RemapConfig:
    """Oneiros parameter remapping (``remap.controller``).

    Off unless ``enabled``. ``cap_fraction`` bounds the share of one model's layers
    that may be remapped; ``headroom_fraction`` of the arena is the hysteresis of
    dynamic reversion; ``capacity_order`` is the order in which the engine takes device
    memory when KV runs short (names of ``CAPACITY_SOURCES``, ``"free"`` first; leave
    one out never to use it); ``ewma_weight`` weighs each measured forward pass and layer
    copy in the time estimates (``remap.timing``).
    """

    enabled: bool = False
    cap_fraction: float = 0.5
    headroom_fraction: float = 0.05
    capacity_order: tuple[str, ...] = CAPACITY_SOURCES
    ewma_weight: float = 0.2

    def __post_init__(self) -> None:
        if not 0 <= self.cap_fraction < 1:
            raise ValueError("cap_fraction must be in [0, 1)")
        if not 0 <= self.headroom_fraction < 1:
            raise ValueError("headroom_fraction must be in [0, 1)")
        if not 0 < self.ewma_weight <= 1:
            raise ValueError("ewma_weight must be in (0, 1]")
        order = self.capacity_order
        if not order or order[0] != "free":
            raise ValueError(f"capacity order must start with 'free': {list(order)}")
        if any(s not in CAPACITY_SOURCES for s in order) or len(set(order)) != len(order):
            raise ValueError(
                f"capacity order takes distinct names of {CAPACITY_SOURCES}: {list(order)}"
            )

    def cap_layers(self, num_layers: int) -> int:
        """The most of ``num_layers`` decoder layers remapping may lend (``cap_fraction``
        of them, rounded down); what the layers' timing allows may be fewer
        (``remap.layers.max_alpha``)."""
        return math.floor(self.cap_fraction * num_layers)


@dataclass(frozen=True)
class EngineConfig:
    """One engine: the models it serves, the memory it manages, and its knobs.

    ``device_bytes`` is the device arena (weights of every model plus KV), split into
    pages of ``page_bytes``; ``host_swap_bytes`` is the host memory for swapped KV.
    A KV block holds ``block_tokens`` tokens of all layers (block-first layout).
    ``tenants`` gives models their sharing mode, SLO class, priority and KV bounds; a
    model without one is spatial, priority 0, unbounded. ``check_integrity`` runs the
    memory integrity check after every step (tests, debug). ``prefix_caching`` shares
    the full blocks of prompts' common prefixes between requests of a model
    (``memory/prefix.py``); it needs requests' token ids, so it only acts where they
    are known. ``async_scheduling`` plans each step while the executor runs the one
    before (``EngineCore``): the host's planning leaves the critical path, at the cost
    of one wasted entry for each request that stops on a token. On a CUDA device,
    decode steps replay CUDA graphs (``exec/graphs.py``) unless ``enforce_eager``.
    """

    models: tuple[ModelSpec, ...]
    device_bytes: int
    host_swap_bytes: int
    page_bytes: int = 2 * 1024 * 1024
    block_tokens: int = 16
    scheduler: SchedulerConfig = SchedulerConfig()
    rotation: RotationConfig = RotationConfig()
    tenants: tuple[TenantSpec, ...] = ()
    remap: RemapConfig = RemapConfig()
    check_integrity: bool = False
    prefix_caching: bool = False
    async_scheduling: bool = False
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("EngineConfig needs at least one model")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique: {names}")
        if self.page_bytes <= 0 or self.block_tokens <= 0:
            raise ValueError("page_bytes and block_tokens must be positive")
        if self.device_bytes < self.page_bytes:
            raise ValueError("device_bytes must hold at least one page")
        if self.host_swap_bytes < 0:
            raise ValueError("host_swap_bytes must be >= 0")
        tenants = [t.model for t in self.tenants]
        if len(set(tenants)) != len(tenants) or not set(tenants) <= set(names):
            raise ValueError(f"tenants must name distinct served models: {tenants}")

    @cached_property
    def num_pages(self) -> int:
        return self.device_bytes // self.page_bytes

    @cached_property
    def model_by_name(self) -> dict[str, ModelSpec]:
        return {m.name: m for m in self.models}

    @cached_property
    def tenant_by_model(self) -> dict[str, TenantSpec]:
        """Every model's tenancy, defaults filled in, in the order of ``models``."""
        given = {t.model: t for t in self.tenants}
        return {m.name: given.get(m.name, TenantSpec(m.name)) for m in self.models}

    def block_bytes(self, model: str) -> int:
        return self.model_by_name[model].block_bytes(self.block_tokens)
