"""The serving-engine seam: add a request, run one scheduler step and get its record, sleep and wake.

Implementations: `commitenv.backends.fake_engine.SimEngine` (the simulator's replica, on the compiled loop's
step functions, on a virtual clock) and
`commitenv.backends.vllm_engine.VllmEngine` (vLLM's engine stepped in-process). A step record carries the token
counts of the step laws (P, n, L, A; see `commitenv.profiles.schema`), so measured steps fit a profile directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepRecord:
    """One engine step: when it started and how long it took (s), its prefill tokens ``P``, prefill attention
    pairs ``A``, decoding requests ``n`` and summed decode context ``L``, the requests that got their first token,
    those that finished and those the scheduler preempted while forming the step (ids; vLLM's
    ``SchedulerOutput.preempted_req_ids``), and each scheduled request's progress after it (id, tokens computed,
    tokens generated: absolute counts), from which a backend follows every request."""

    t_start: float
    elapsed_s: float
    P: int
    A: int
    n: int
    L: int
    first_token: tuple[str, ...] = field(default=())
    finished: tuple[str, ...] = field(default=())
    progress: tuple[tuple[str, int, int], ...] = field(default=())
    preempted: tuple[str, ...] = field(default=())


class ServingEngine(ABC):
    """One model instance on one GPU."""

    @abstractmethod
    def add_request(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        """Queue a request of ``prompt_tokens`` prompt tokens that generates exactly ``max_tokens`` tokens."""

    @abstractmethod
    def step(self) -> StepRecord | None:
        """Run one scheduler step (blocking until it is done); None when nothing is queued."""

    @abstractmethod
    def has_work(self) -> bool:
        """Whether any request is queued or running."""

    @abstractmethod
    def sleep(self) -> None:
        """Park the instance (weights kept where the engine can; no request may be in flight)."""

    @abstractmethod
    def wake(self) -> None:
        """Make a parked instance serve again."""
