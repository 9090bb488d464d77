"""The liveness invariant: while any request is live, some request makes progress.

Progress is a token emitted. A model with work must get a step within a bounded time
(turns pass, memory is reclaimed across models, rotated requests come back), so an
engine whose live requests emit nothing for long is livelocked: steps that move state
(copies, turns, remapping) or recompute, and nobody advances. ``ProgressWatch`` checks
it: the simulator on every run, the engine after every step in debug mode
(``EngineConfig.check_integrity``), the property tests through both.
"""

from __future__ import annotations

from dataclasses import dataclass

# No wait the engine makes near it: B_xfer bounds the copies planned per step (2,400
# blocks of 4 MiB, ~10 GB, cross a ~100 GB/s link in ~0.1 s), a temporal turn is at
# most the tightest TTFT target, every copy in flight lands within seconds, and the
# longest prompt (a model's context, chunked) is prefilled within seconds. Past it the
# engine is livelocked, whatever completions remain.
NO_PROGRESS_LIMIT_S = 60.0
# The same in steps, for livelocks that stop a virtual clock (steps that compute nothing
# and move only the temporal turn advance no simulated time): far more than any stretch
# without a token (a context-long prompt prefilled at the step budget's least chunk
# takes a few hundred).
NO_PROGRESS_LIMIT_STEPS = 10_000


class NoProgress(RuntimeError):
    """Requests are live but none has emitted a token within the watch's limits."""


@dataclass
class ProgressWatch:
    """Raises ``NoProgress`` once live requests go ``limit_s`` seconds or
    ``limit_steps`` steps (None: no bound in steps, for a wall clock, which never stops)
    without a token. Call ``observe`` after every step and ``rest`` when requests
    arrive at an idle engine (nothing was live: nothing owed progress)."""

    limit_s: float = NO_PROGRESS_LIMIT_S
    limit_steps: int | None = NO_PROGRESS_LIMIT_STEPS
    t_progress: float = 0.0
    num_steps_since: int = 0

    def rest(self, now: float) -> None:
        """Idle at ``now``: the clock of the invariant starts again."""
        self.t_progress, self.num_steps_since = now, 0

    def observe(self, *, now: float, step: int, num_emitted: int, num_live: int) -> None:
        """A step ended at ``now`` having emitted ``num_emitted`` tokens, with
        ``num_live`` requests live after it."""
        if num_emitted or not num_live:
            self.rest(now)
            return
        self.num_steps_since += 1
        too_many = self.limit_steps is not None and self.num_steps_since > self.limit_steps
        if now - self.t_progress > self.limit_s or too_many:
            raise NoProgress(
                f"step {step}: {num_live} live requests and no token since "
                f"t = {self.t_progress:.3f} s, {self.num_steps_since} steps ago "
                f"(now {now:.3f} s)"
            )
