"""TorchExecutor: runs EngineCore's step plans on real models.

Each model's weights and KV cache are views into the one DeviceArena; the block ids in
a plan index those KV views directly. The plan is all the executor reads: each batch
entry's tokens and block table come with it (``StepPlan.token_ids``, ``block_tables``);
the tokens a request sampled, which penalties need, it keeps itself. Parameter
remapping (the plan's ``remapped``, ``restored`` and ``streams``) changes where a
model's layers are read from: ``slots.WeightFrames``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import llguidance
import torch

from shunter.engine.exec.batch import ForwardBatch, SequenceChunk
from shunter.engine.exec.detok import IncrementalDetokenizer
from shunter.engine.exec.grammar import GrammarTokenizers, consume, mask_logits, new_matcher
from shunter.engine.exec.graphs import StaticDecode
from shunter.engine.exec.model import Transformer
from shunter.engine.exec.params import SamplingParams, TokenLogprob
from shunter.engine.exec.sampling import apply_penalties, request_generator, sample
from shunter.engine.exec.slots import CopyStream, SlotPass, WeightFrames
from shunter.engine.exec.stop import StopChecker
from shunter.engine.exec.transfers import KVTransfers
from shunter.engine.interfaces import Executor
from shunter.engine.plan import BatchEntry, StepPlan, StepResult


@dataclass
class ServedModel:
    """A model as the executor runs it: forward pass, KV view, and what ends a request.

    ``token_bytes`` is the tokenizer's byte table (``detok.token_bytes``) and
    ``tokenizer_json`` the tokenizer itself, for grammars. ``frames``
    (a model in the arena) lets plans remap its layers; without it they never move.
    """

    model: Transformer
    kv_cache: torch.Tensor
    block_tokens: int
    eos_token_ids: tuple[int, ...]
    token_bytes: list[bytes]
    frames: WeightFrames | None = None
    tokenizer_json: str = ""  # for constrained output (``grammar``)
    static: StaticDecode | None = None  # decode steps on static buffers (CUDA graphs)


@dataclass
class _Sequence:
    params: SamplingParams
    generator: torch.Generator | None
    stop: StopChecker
    logprobs: list[TokenLogprob] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)  # the tokens sampled so far
    prompt: tuple[int, ...] = ()  # for the repetition penalty
    matcher: llguidance.LLMatcher | None = None  # with a grammar


class TorchExecutor(Executor):
    """Executes plans: block moves, then one forward pass per model, then sampling.

    ``transfers`` runs the plans' KV copies: before the forward pass, the executor has
    it order the pass after the H2D copies of the requests it reads. Register each
    model with :meth:`add_model` and give each request its sampling parameters with
    :meth:`add_request` before it is scheduled. A request's text and finish reason are
    readable (:meth:`output`) until a plan releases it.

    ``num_layers_streamed`` and ``num_layers_restored`` count the layer copies of
    parameter remapping so far: into slots during forward passes, and back into frames.
    """

    def __init__(self, transfers: KVTransfers) -> None:
        self.transfers = transfers
        self.models: dict[str, ServedModel] = {}
        self.num_layers_streamed = 0
        self.num_layers_restored = 0
        self._copies: dict[torch.device, CopyStream] = {}
        self._sequences: dict[str, _Sequence] = {}
        self._grammar_tokenizers = GrammarTokenizers()

    def add_model(self, name: str, served: ServedModel) -> None:
        self.models[name] = served
        if served.tokenizer_json:
            # Built now, not on the first constrained request: for a large vocabulary it
            # takes up to a second, which would stall every model's step.
            self._grammar_tokenizer(name)
        device = served.model.device
        if device not in self._copies:
            self._copies[device] = CopyStream(device)

    def _grammar_tokenizer(self, model: str) -> llguidance.LLTokenizer:
        served = self.models[model]
        return self._grammar_tokenizers.get(
            model, served.tokenizer_json, served.model.arch.vocab_size, served.eos_token_ids
        )

    def remove_model(self, name: str) -> None:
        """Stop running a model (none of its requests may be scheduled again)."""
        del self.models[name]
        self._grammar_tokenizers.forget(name)

    def add_request(
        self, request_id: str, model: str, params: SamplingParams, prompt: Sequence[int] = ()
    ) -> None:
        served = self.models[model]
        detok = IncrementalDetokenizer(served.token_bytes)
        matcher = None
        if params.grammar is not None:
            matcher = new_matcher(self._grammar_tokenizer(model), params.grammar)
        self._sequences[request_id] = _Sequence(
            params=params,
            generator=request_generator(params, served.model.device),
            stop=StopChecker(params, served.eos_token_ids, detok),
            prompt=tuple(prompt) if params.repetition_penalty != 1 else (),
            matcher=matcher,
        )

    def output(self, request_id: str) -> tuple[str, str | None]:
        """The request's text so far and its finish reason (None while running)."""
        stop = self._sequences[request_id].stop
        return stop.text, stop.finish_reason

    def stop_reason(self, request_id: str) -> str | int | None:
        """The stop string or stop token id that ended the request (vLLM's
        ``stop_reason``); None for EOS, the length limit, or while running."""
        return self._sequences[request_id].stop.stop_reason

    def take_logprobs(self, request_id: str) -> list[TokenLogprob]:
        """The log-probabilities of the tokens sampled since the last call (requests
        with ``params.logprobs`` set); readable as long as :meth:`output` is."""
        seq = self._sequences[request_id]
        taken, seq.logprobs = seq.logprobs, []
        return taken

    def take_visible(self, request_id: str) -> str:
        """The request's text not taken before that no stop string can still cut
        (``StopChecker.take_visible``); readable as long as :meth:`output` is."""
        return self._sequences[request_id].stop.take_visible()

    def execute(self, plan: StepPlan) -> StepResult:
        return self.sample(plan, self.forward(plan))

    def forward(self, plan: StepPlan) -> _Forwarded:
        """Block moves, remapping and each model's forward pass, up to its logits. Reads
        the plan and the models only, never a request's sampling state, so it may run
        beside the engine's thread (``Executor.forward``)."""
        t_start = time.perf_counter()
        self.transfers.wait_swapped_in(e.request_id for e in plan.batch)
        for model, moves in plan.moves.items():
            if moves:
                kv = self.models[model].kv_cache
                src = torch.tensor([m.src for m in moves], device=kv.device)
                dst = torch.tensor([m.dst for m in moves], device=kv.device)
                kv[dst] = kv[src]
        self._remap(plan)
        passes: list[_ModelPass] = []
        for model, served in self.models.items():
            entries = [e for e in plan.batch if e.model == model]
            if entries:
                passes.append(self._run(model, served, entries, plan))
        return _Forwarded(t_start, passes)

    def sample(self, plan: StepPlan, forwarded: object) -> StepResult:
        """Sample each pass's tokens, advance the requests' stop checks, grammars and
        logprobs, and wait for the device; drops the plan's released requests first."""
        if not isinstance(forwarded, _Forwarded):
            raise TypeError(f"not a forward pass of this executor: {type(forwarded).__name__}")
        for request_id in plan.released:
            self._sequences.pop(request_id, None)
        result = StepResult(duration_s=0.0)
        for p in forwarded.passes:
            self._sample(p, result)
        for device, copies in self._copies.items():
            if device.type == "cuda":
                # The compute stream and the weight copies (restores of models that did
                # not run): the KV transfer streams run on.
                torch.cuda.current_stream(device).synchronize()
                copies.synchronize()
        result.compute_s = {p.model: p.timer.compute_s() for p in forwarded.passes}
        for p in forwarded.passes:
            copy_s = p.timer.copy_s()
            if copy_s is not None:
                result.copy_s[p.model] = copy_s
        result.duration_s = time.perf_counter() - forwarded.t_start
        return result

    def _remap(self, plan: StepPlan) -> None:
        """Lend the plan's frames to the KV cache and load its restored layers (after
        the moves that vacated their frames)."""
        for model, frames in plan.remapped.items():
            self._frames(model).lend(frames)
        for model, loads in plan.restored.items():
            copies = self._copies[self.models[model].model.device]
            self.num_layers_restored += self._frames(model).restore(loads, copies)

    def _frames(self, model: str) -> WeightFrames:
        frames = self.models[model].frames
        if frames is None:
            raise RuntimeError(f"model {model!r} has no weight frames to remap")
        return frames

    def _run(
        self, model: str, served: ServedModel, entries: list[BatchEntry], plan: StepPlan
    ) -> _ModelPass:
        chunks = []
        for e in entries:
            tokens = plan.token_ids.get(e.request_id)
            if tokens is None:
                raise ValueError(f"step {plan.step}: no token ids for {e.request_id!r}")
            blocks = plan.block_tables[e.request_id]
            chunks.append(SequenceChunk(tokens, e.num_computed_tokens, blocks, e.samples))
        layers: SlotPass | None = None
        if served.frames is not None:
            schedule = served.frames.schedule(plan.streams.get(model))
            layers = served.frames.begin(schedule, self._copies[served.model.device])
        static = served.static
        streams = layers is not None and layers.streams
        if static is not None and static.fits(chunks, streams):
            timer = _PassTimer(served.model.device)
            logits = static.run(chunks)
        else:
            batch = ForwardBatch.build(
                chunks,
                block_tokens=served.block_tokens,
                device=served.model.device,
                sliding_window=served.model.arch.sliding_window,
            )
            timer = _PassTimer(served.model.device)
            logits = served.model.forward(batch, served.kv_cache, layers)
        timer.stop(layers)
        if layers is not None:
            self.num_layers_streamed += layers.num_copies
        sampled = [e.request_id for e in entries if e.samples]
        return _ModelPass(model, sampled, logits, timer)

    def _sample(self, p: _ModelPass, result: StepResult) -> None:
        # A request an earlier step stopped may still be in this plan (planned while
        # that step ran): its row is computed, not sampled.
        seqs = self._sequences
        rows = [i for i, rid in enumerate(p.sampled) if seqs[rid].stop.finish_reason is None]
        if not rows:
            return
        sampled = [p.sampled[i] for i in rows]
        logits = p.logits if len(rows) == len(p.sampled) else p.logits[rows]
        sampling = [seqs[request_id] for request_id in sampled]
        params = [s.params for s in sampling]
        outputs = [s.outputs for s in sampling]
        constrained = [(row, s.matcher) for row, s in enumerate(sampling) if s.matcher is not None]
        tokens = sample(
            mask_logits(
                apply_penalties(logits, params, outputs, [s.prompt for s in sampling]),
                constrained,
            ),
            params,
            [s.generator for s in sampling],
            [s.stop.banned_tokens() for s in sampling],
        )
        _record_logprobs(logits, sampling, tokens)
        for request_id, seq, token in zip(sampled, sampling, tokens, strict=True):
            result.emitted[request_id] = token
            seq.outputs.append(token)
            done = seq.matcher is not None and consume(seq.matcher, token)
            if seq.stop.append(token, grammar_done=done) is not None:
                result.stopped.add(request_id)


@dataclass
class _ModelPass:
    """One model's forward pass of a step: the requests it samples, in row order, their
    logits, and its timer."""

    model: str
    sampled: list[str]
    logits: torch.Tensor
    timer: _PassTimer


@dataclass
class _Forwarded:
    """A step's forward passes (``TorchExecutor.forward``), for ``sample``."""

    t_start: float
    passes: list[_ModelPass]


class _PassTimer:
    """A forward pass's compute time: its span less its waits for weight copies (so a
    stall never makes room for more remapping); and the mean time of its slot copies.
    On CUDA, events read after the step's synchronization."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.pass_: SlotPass | None = None
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self.end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self.start.record(torch.cuda.current_stream(device))
        self.t0 = time.perf_counter()
        self.t1 = self.t0

    def stop(self, layers: SlotPass | None) -> None:
        self.t1 = time.perf_counter()
        self.pass_ = layers
        if self.cuda:
            self.end.record(torch.cuda.current_stream(self.device))

    def compute_s(self) -> float:
        span = self.start.elapsed_time(self.end) / 1e3 if self.cuda else self.t1 - self.t0
        waits = self.pass_.times.wait_s() if self.pass_ is not None else 0.0
        return max(0.0, span - waits)

    def copy_s(self) -> float | None:
        """The mean time the pass's slot copies took, None without any."""
        return None if self.pass_ is None else self.pass_.times.copy_s()


# JSON has no -inf: a token the model rules out reports this instead (as vLLM does).
MIN_LOGPROB = -9999.0


def _record_logprobs(logits: torch.Tensor, sampling: list[_Sequence], tokens: list[int]) -> None:
    """Append each sampled token's log-probability to the sequences that ask for them."""
    rows = [i for i, s in enumerate(sampling) if s.params.logprobs is not None]
    if not rows:
        return
    logprobs = torch.log_softmax(logits[rows].float(), dim=-1).clamp(min=MIN_LOGPROB)
    k = max(sampling[i].params.logprobs or 0 for i in rows)
    top_values, top_ids = torch.topk(logprobs, k, dim=-1) if k else (None, None)
    chosen = logprobs[torch.arange(len(rows)), torch.tensor([tokens[i] for i in rows])].tolist()
    for row, i in enumerate(rows):
        n = sampling[i].params.logprobs or 0
        top: tuple[tuple[int, float], ...] = ()
        if n and top_ids is not None and top_values is not None:
            top = tuple(zip(top_ids[row, :n].tolist(), top_values[row, :n].tolist(), strict=True))
        sampling[i].logprobs.append(TokenLogprob(tokens[i], chosen[row], top))
