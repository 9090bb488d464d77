"""The requests a workload is made of: the simulator's (token counts and a model) and the
load generator's (a prompt to send), and the error for workload input that cannot be
used."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload: arrival time in seconds from the start, prompt and
    output lengths in tokens, and the model it is for."""

    t: float
    prompt_tokens: int
    output_tokens: int
    model: str

    def __post_init__(self) -> None:
        if self.t < 0 or self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"invalid workload request {self}")


@dataclass(frozen=True)
class RequestSpec:
    """One request to send.

    ``input_len`` is the prompt's length in tokens (measured or estimated, see
    ``shunter.engine.workload.sources``); ``output_len`` the output tokens asked for.
    ``t`` is the arrival time in seconds from the start of a trace, None for workloads
    that leave arrivals to an arrival process.
    """

    prompt: str
    input_len: int
    output_len: int
    t: float | None = None


class WorkloadError(ValueError):
    """A workload file or length spec that cannot be used; the message says where and why."""
