"""The engine loop: one thread that owns the TorchEngine and steps it while work exists.

Only this thread touches the engine. The HTTP side sends it commands (add requests,
abort one, run a function and return its result) through a queue; the thread blocks on
that queue when the engine is idle, so an idle server does not spin. After each step it
hands every request's new tokens and text to the request's ``Stream``, an asyncio queue
read by the HTTP handler on the event loop.

Readers on other threads (``/health``, ``/admin/state``) never wait for a step: the
thread publishes an immutable ``EngineSnapshot`` after steps, after each ``call`` and
before it waits idle, and they read the latest one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from shunter.engine.config import SloSpec
from shunter.engine.core import StepStats
from shunter.engine.exec.params import SamplingParams, TokenLogprob
from shunter.engine.exec.serving import TorchEngine
from shunter.engine.request import Request
from shunter.engine.server.metrics import ServerMetrics
from shunter.engine.server.state import EngineSnapshot

log = logging.getLogger("shunter.engine.server")
T = TypeVar("T")
RECENT_STEPS = 64
ABORTED = "abort"
# Taking a snapshot walks the arena's pages: after steps, at most one in this many
# seconds (and after any step that finished a request), so a busy engine spends little
# on it while readers see state at most this much older than the last step.
SNAPSHOT_INTERVAL_S = 0.1
# A loop that has published nothing for this long while it has work is stuck: a step
# (or a command) runs that long. Far above any sane step, so a slow one is not a stall.
DEFAULT_STALL_AFTER_S = 30.0


@dataclass(frozen=True)
class Delta:
    """New output of one request: token ids, the text they made visible, and the finish
    reason once it ended (``"stop"``, ``"length"``, or ``"abort"`` with ``error``)."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_reason: str | int | None = None


class Stream:
    """One engine request (one choice of an HTTP request) as its handler follows it:
    each Delta arrives in ``sink`` as ``(index, delta)``, on the event loop ``loop``.
    The choices of one HTTP request share one sink. ``t_arr`` is when the HTTP request
    arrived, on the engine's clock (its TTFT and lag count from then, not from when
    the engine thread took it up). A ``whole`` response (not streamed) gets one Delta,
    when its request ends: its handler reads nothing before, and a fan-out of many
    choices then costs the event loop one wake-up per choice, not one per token."""

    def __init__(
        self,
        index: int,
        model: str,
        prompt_ids: list[int],
        params: SamplingParams,
        slo: SloSpec | None,
        sink: asyncio.Queue[tuple[int, Delta]],
        loop: asyncio.AbstractEventLoop,
        t_arr: float,
        tenant: str = "",
        cache_salt: str | None = None,
        *,
        whole: bool = False,
    ) -> None:
        self.index = index
        self.whole = whole
        self.t_arr = t_arr
        self.tenant = tenant
        self.cache_salt = cache_salt
        self.model = model
        self.prompt_ids = prompt_ids
        self.params = params
        self.slo = slo
        self.sink = sink
        self.request: Request | None = None
        self.num_sent = 0  # tokens delivered
        self.num_metered = 0  # tokens counted in the metrics
        self.num_preemptions = 0
        self.loop = loop

    @property
    def request_id(self) -> str | None:
        return None if self.request is None else self.request.id

    def put(self, delta: Delta) -> None:
        self.loop.call_soon_threadsafe(self.sink.put_nowait, (self.index, delta))


class EngineLoop:
    """Steps ``engine`` on a thread of its own; see the module docstring.

    ``snapshot`` is the latest published state; ``stalled`` says whether the thread has
    published nothing for ``stall_after_s`` seconds while it was not waiting idle.
    """

    def __init__(
        self,
        engine: TorchEngine,
        metrics: ServerMetrics,
        *,
        stall_after_s: float = DEFAULT_STALL_AFTER_S,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.stall_after_s = stall_after_s
        self.recent_steps: deque[StepStats] = deque(maxlen=RECENT_STEPS)
        self.bytes_moved = {"d2h": 0, "h2d": 0}
        self._arena_version = -1
        self._streams: dict[str, Stream] = {}
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        # True while the thread blocks on an empty command queue: nothing changes then,
        # so an old snapshot is still the current state.
        self._waiting_idle = False
        self.snapshot = EngineSnapshot.take(self)

    # -- from any thread ---------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, reason: str = "the engine is shutting down") -> None:
        """Abort every live request (their streams end with ``reason``) and end the
        thread (once; later calls return)."""
        if not self._thread.is_alive():
            return
        self._commands.put(lambda: self._stop(reason))
        self._thread.join()

    def submit(self, streams: Sequence[Stream]) -> None:
        self._commands.put(lambda: self._add(streams))

    def abort(self, stream: Stream) -> None:
        self._commands.put(lambda: self._abort(stream, None))

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine thread between steps and return its result."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            # ``fn`` runs even when the caller has given up (a command may change state);
            # its outcome then has nobody to go to. What it changed is published before
            # the caller hears back, so its next read of the snapshot shows it.
            try:
                result = fn()
            except Exception as e:  # handed to the caller
                self._publish()
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_exception(e)
            else:
                self._publish()
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_result(result)

        self._commands.put(run)
        return await asyncio.wrap_future(future)

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    @property
    def num_pending_commands(self) -> int:
        """Commands queued for the engine thread, not yet run."""
        return self._commands.qsize()

    @property
    def stalled(self) -> bool:
        """The thread runs but has published nothing for ``stall_after_s`` seconds while
        it was busy (a step or command that long, or a hang). Safe from any thread."""
        return (
            self._thread.is_alive()
            and not self._waiting_idle
            and self.snapshot.age_s() > self.stall_after_s
        )

    # -- on the engine thread ----------------------------------------------------------
    def _run(self) -> None:
        while not self._stopped:
            self._drain(block=self.engine.core.is_idle())
            if self._stopped or self.engine.core.is_idle():
                continue
            try:
                self._step()
            except Exception:
                log.exception("engine step failed; aborting every live request")
                for stream in list(self._streams.values()):
                    self._abort(stream, "the engine failed while running this request")

    def _drain(self, *, block: bool) -> None:
        if block:
            # Going idle: what ended without a step after it (aborts) leaves the gauges as
            # the last step set them, so they are read again with the snapshot.
            self._observe_queues()
            self._publish()
            self._waiting_idle = True
        try:
            command = self._commands.get(block=block)
        except queue.Empty:
            return
        finally:
            self._waiting_idle = False
        while True:
            try:
                command()
            except Exception:  # one command's failure must not stop the engine thread
                log.exception("an engine command failed")
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _stop(self, reason: str) -> None:
        for stream in list(self._streams.values()):
            self._abort(stream, reason)
        self._stopped = True

    def abort_models(self, models: set[str], reason: str) -> None:
        """Abort every live request of ``models``; call it on the engine thread."""
        for stream in list(self._streams.values()):
            if stream.model in models:
                self._abort(stream, reason)

    def _add(self, streams: Sequence[Stream]) -> None:
        core = self.engine.core
        if streams:
            first = streams[0]
            self.metrics.on_request(first.model, len(streams), first.params.max_tokens)
        for stream in streams:
            try:
                kwargs = {} if stream.slo is None else {"slo": stream.slo}
                request_id = self.engine.add_request(
                    stream.model,
                    stream.prompt_ids,
                    stream.params,
                    t_arr=stream.t_arr,
                    cache_salt=stream.cache_salt,
                    **kwargs,
                )
            except ValueError as e:
                stream.put(Delta([], "", ABORTED, str(e)))
                continue
            stream.request = core.scheduler.requests[request_id]
            self._streams[request_id] = stream
            self.metrics.prompt_tokens.labels(stream.model).inc(len(stream.prompt_ids))

    def _abort(self, stream: Stream, error: str | None) -> None:
        request_id = stream.request_id
        # Identity, not id: after a reload a new engine may reuse the id.
        if request_id is None or self._streams.get(request_id) is not stream:
            return
        del self._streams[request_id]
        request = self.engine.core.abort(request_id)
        if request is not None:
            self.metrics.on_finish(request, ABORTED, stream.tenant)
        if error is not None:
            stream.put(Delta([], "", ABORTED, error))

    def _publish(self) -> None:
        """Swap in a new snapshot (one attribute write: readers see the old or the new)."""
        try:
            self.snapshot = EngineSnapshot.take(self)
        except Exception:  # a reader's view must never stop the engine thread
            log.exception("taking the engine snapshot failed")

    def _step(self) -> None:
        stats, outputs = self.engine.step_with_stats()
        self.recent_steps.append(stats)
        finished = {o.request_id: o for o in outputs}
        metrics = self.metrics
        # One wake-up of each event loop per step, however many streams it serves.
        deliveries: dict[asyncio.AbstractEventLoop, list[tuple[Stream, Delta]]] = {}
        for request_id, stream in list(self._streams.items()):
            request = stream.request
            assert request is not None
            if request.num_preemptions != stream.num_preemptions:
                metrics.preemptions.labels(stream.model).inc(
                    request.num_preemptions - stream.num_preemptions
                )
                stream.num_preemptions = request.num_preemptions
            output = finished.get(request_id)
            if stream.num_metered < len(request.token_times):
                metrics.on_tokens(request, stream.num_metered)
                stream.num_metered = len(request.token_times)
            new = request.output_token_ids[stream.num_sent :]
            if (not new or stream.whole) and output is None:
                continue
            executor = self.engine.executor
            text = executor.take_visible(request_id)
            logprobs = [] if stream.params.logprobs is None else executor.take_logprobs(request_id)
            stream.num_sent += len(new)
            if output is None:
                delta = Delta(new, text, logprobs=logprobs)
            else:
                del self._streams[request_id]
                metrics.on_finish(request, output.finish_reason, stream.tenant)
                delta = Delta(
                    new,
                    text,
                    output.finish_reason,
                    logprobs=logprobs,
                    stop_reason=output.stop_reason,
                )
            deliveries.setdefault(stream.loop, []).append((stream, delta))
        # Before deliveries: a client that saw its request end reads a state without it.
        if outputs or self.snapshot.age_s() >= SNAPSHOT_INTERVAL_S:
            self._publish()
        for loop, batch in deliveries.items():
            loop.call_soon_threadsafe(_deliver, batch)
        self._observe(stats)
        if not (stats.num_batch_tokens or stats.d2h_blocks or stats.h2d_blocks or outputs):
            if self.engine.core.memory.num_pending_steps:
                self.engine.transfers.synchronize()
            else:
                time.sleep(0.001)  # nothing runnable this step: do not spin

    def _observe(self, stats: StepStats) -> None:
        metrics, core = self.metrics, self.engine.core
        metrics.on_step(stats.duration_s, stats.tokens_by_model)
        metrics.rotations.inc(stats.num_swapped_in)
        for direction, nbytes in (("d2h", stats.d2h_bytes), ("h2d", stats.h2d_bytes)):
            self.bytes_moved[direction] += nbytes
            metrics.swapped_bytes.labels(direction).inc(nbytes)
        memory = core.memory
        if memory.arena.version != self._arena_version:
            self._arena_version = memory.arena.version
            for model in core.scheduler.queues:
                metrics.remapped_layers.labels(model).set(len(memory.remapped_layers(model)))
                metrics.on_cache(
                    model,
                    block_size=memory.block_tokens,
                    gpu_blocks=memory.num_total_blocks(model),
                    cpu_blocks=memory.host.num_used(model) + memory.host.num_free(model),
                    dtype=str(self.engine.executor.models[model].kv_cache.dtype).removeprefix(
                        "torch."
                    ),
                    prefix_caching=memory.prefix_caching,
                )
        if memory.prefix_caching:
            metrics.on_prefix_cache(memory.prefix_stats)
        self._observe_queues()

    def _observe_queues(self) -> None:
        """Each model's requests by state and its KV usage, into the gauges."""
        core = self.engine.core
        for model, q in core.scheduler.queues.items():
            self.metrics.on_queues(
                model,
                running=len(q.running),
                waiting=len(q.waiting),
                rotary=len(q.rotary) + len(q.landing),
                kv=core.memory.usage(model),
            )


def _deliver(batch: list[tuple[Stream, Delta]]) -> None:
    for stream, delta in batch:
        stream.sink.put_nowait((stream.index, delta))
