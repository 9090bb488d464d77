"""The demo's load: each demo tenant sends bursty (gamma) streaming requests through the
gateway with its own key, at rates a 2-core CPU keeps up with. ``LoadProcess`` runs the
generator as a child (``python -m shunter.project.demo load``, its plan on stdin);
``load_main`` is that child."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from shunter.project.demo_children import DemoError, spawn, stop_child


@dataclass(frozen=True)
class LoadStream:
    """One tenant's share of the background load: ``rate`` requests/s with gamma gaps of
    shape ``burstiness`` (below 1: bursts), prompts of ``prompt_words`` random words (about
    2.4 tiny-tokenizer tokens each) asking for ``output_tokens``; both are lengths as
    ``shunter bench serve`` reads them (``N``, ``LO..HI``, ``exp:MEAN``)."""

    tenant: str
    model: str
    rate: float
    burstiness: float
    prompt_words: str
    output_tokens: str


# The tenants of seed_demo: interactive chat on the temporal model, batch jobs with long
# prompts and replies on the spatial one, in tight bursts (gamma shape 0.15: gaps with a
# CV of 2.6), whose KV outgrows the arena and rotates. Modest mean rates: the engine, the
# web server and this generator share a 2-core CPU.
LOAD = (
    LoadStream("demo-chat", "tiny-llama", 0.6, 0.3, "40..200", "16..64"),
    LoadStream("demo-batch", "tiny-qwen2", 0.4, 0.15, "250..550", "128..256"),
)
# The generator reports each stream every this many seconds (its arrivals are drawn a
# chunk at a time).
LOAD_CHUNK_S = 120.0


@dataclass
class LoadProcess:
    """The background load generator (``python -m shunter.project.demo load``)."""

    proc: subprocess.Popen[bytes]

    @classmethod
    def start(cls, base_url: str, secrets_by_tenant: dict[str, str], log: Path) -> LoadProcess:
        """Start it against the gateway at ``base_url``; the plan, keys included, goes
        on its stdin. It waits for the gateway to answer before it sends."""
        plan = {
            "base_url": base_url,
            "streams": [
                {**asdict(stream), "key": secrets_by_tenant[stream.tenant]}
                for stream in LOAD
                if stream.tenant in secrets_by_tenant
            ],
        }
        proc = spawn(
            [sys.executable, "-m", "shunter.project.demo", "load"], log, stdin=subprocess.PIPE
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(plan).encode())
        proc.stdin.close()
        return cls(proc)

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM) without waiting: safe in a signal handler."""
        if self.proc.poll() is None:
            self.proc.terminate()

    def stop(self) -> None:
        stop_child(self.proc)


async def _wait_for_gateway(base_url: str, timeout_s: float) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(base_url + "/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise DemoError(f"{base_url} did not answer within {timeout_s:.0f} s")
            await asyncio.sleep(0.5)


async def _run_stream(base_url: str, stream: LoadStream, key: str, index: int) -> None:
    """Send ``stream`` forever, a chunk of arrivals at a time, reporting each chunk."""
    from shunter.engine.loadgen.arrivals import ArrivalProcess
    from shunter.engine.loadgen.client import Target
    from shunter.engine.loadgen.runner import run_rate_async
    from shunter.engine.workload.sources import LengthDist, SyntheticWorkload

    target = Target(base_url, stream.model, key)
    workload = SyntheticWorkload(
        LengthDist.parse(stream.prompt_words), LengthDist.parse(stream.output_tokens)
    )
    for chunk in itertools.count():
        result = await run_rate_async(
            target,
            workload,
            stream.rate,
            arrival=ArrivalProcess(stream.burstiness),
            duration_s=LOAD_CHUNK_S,
            seed=chunk * len(LOAD) + index,
            request_timeout_s=60.0,
        )
        report = result.report
        errors = sorted({r.error_type or str(r.status) for r in result.requests if not r.success})
        print(
            f"{stream.tenant} -> {stream.model}: {report.completed} of {report.num_prompts} "
            f"requests completed, median TTFT {report.median_ttft_ms or 0:.0f} ms, median "
            f"TPOT {report.median_tpot_ms or 0:.1f} ms"
            + (f", failures: {', '.join(errors)}" if errors else ""),
            flush=True,
        )


async def run_load(plan: dict[str, Any], *, gateway_wait_s: float = 120.0) -> None:
    """Run a load plan (``LoadProcess.start`` writes it) until cancelled."""
    base_url = str(plan["base_url"])
    await _wait_for_gateway(base_url, gateway_wait_s)
    streams = [
        (LoadStream(**{k: v for k, v in s.items() if k != "key"}), str(s["key"]))
        for s in plan["streams"]
    ]
    print(f"load: {', '.join(f'{s.tenant} at {s.rate:g} req/s' for s, _ in streams)}", flush=True)
    await asyncio.gather(
        *(_run_stream(base_url, stream, key, i) for i, (stream, key) in enumerate(streams))
    )


def load_main(stdin: IO[str]) -> int:
    """The load generator child: read the plan, send until SIGTERM or SIGINT, exit 0."""
    from shunter.engine.loadgen.runner import run_async

    plan = json.loads(stdin.read())

    async def until_signalled() -> None:
        task = asyncio.ensure_future(run_load(plan))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        run_async(until_signalled())
    except DemoError as e:
        print(f"load: {e}", file=sys.stderr)
        return 1
    return 0
