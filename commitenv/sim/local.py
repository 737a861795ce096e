"""Local scheduling policies: which queued tasks a replica's next step runs, and at which GPU clock (the engine calls
one each time a replica with a policy can start a step).

A policy sees a `LocalView` of the replica (plain records, never engine objects): its clock, SM share, free KV
blocks, token budget and sequence cap, and one `TaskView` per request it holds, running ones first, then the waiting
queue, each in the engine's order, with the request's progress, the time of its latest output token (per-token TBT
runs from it), predicted output length and visible deadline (never the true ones). It returns a `StepPlan`: the
slots to fill the step from, highest priority first, and optionally a clock for the GPU (requested as the interval
action's clock is: it applies after the profile's clock-change latency, and on every instance of the GPU). Or None:
the engine's vLLM scheduler forms the step (`Replica.schedule`).

Filling a plan (`Replica.schedule_ordered`): each listed task takes ``min(tokens left, budget left)`` tokens (a
decode: one; the budget is the plan's ``token_budget`` when it sets one) if its KV blocks fit and, for a waiting
task, the sequence cap allows; a task that does not fit is skipped and the next one tried (no head-of-line blocking;
no preemption). A plan that fills nothing while the replica holds work falls back to the vLLM scheduler for that
step, which preempts when KV runs out, so a policy can never stall the engine. With a policy, every step is formed
one at a time (no closed-form decode runs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from commitenv.sim.local_compiled import CompiledPlan


class TaskView(NamedTuple):
    """A request held by the replica, as its scheduler may know it."""

    slot: int
    running: bool  # admitted (holds KV blocks); else waiting
    decode: bool  # its next token is a decode (prompt and earlier tokens all computed)
    tokens_left: int  # tokens to compute before its next output token (1 for a decode)
    computed: int
    prompt_tokens: int
    generated: int
    predicted_output_tokens: int
    arrival_s: float
    visible_deadline_s: float
    blocks: int  # KV blocks it holds
    last_token_s: float  # when its latest output token was produced (-1: none yet): a decode's TBT clock


class LocalView(NamedTuple):
    """A replica about to start a step."""

    t: float
    replica: int
    gpu: int
    model: int
    clock_mhz: int
    clocks_mhz: tuple[int, ...]  # the GPU's clock levels
    share: float
    free_kv_blocks: int
    block_tokens: int
    token_budget: int
    max_seqs: int
    tasks: tuple[TaskView, ...]


class StepPlan(NamedTuple):
    """The next step: ``order`` (slots, highest priority first; each at most once), optionally ``clock_mhz`` for the
    GPU (one of its levels) and ``token_budget``, the step's tokens at most (1 .. the replica's budget; None: the
    replica's): a smaller chunk keeps a step short, as Sarathi-Serve sizes chunks to a TBT target."""

    order: tuple[int, ...]
    clock_mhz: int | None = None
    token_budget: int | None = None


def plan_budget(plan: StepPlan, budget: int, policy: str, replica: int) -> int:
    """The token budget of ``plan``'s step (0: the replica's ``budget``); refuses one outside 1 .. ``budget``, naming
    the policy and the replica (both engines check it so)."""
    b = plan.token_budget
    if b is None:
        return 0
    if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= budget:
        raise ValueError(f"local policy {policy!r}: token_budget {b!r} of the plan for replica {replica}: an integer "
                         f"in 1 .. {budget} (the replica's token budget) expected")
    return b


def check_plan(order, held, replica: int) -> None:
    """Refuse a plan that lists a slot twice or one the replica does not hold (``held``: its slots), naming the
    first offender in the plan's order (both engines check a plan so before scheduling any of it)."""
    seen: set[int] = set()
    for slot in order:
        if slot in seen:
            raise ValueError(f"local policy: slot {slot} listed twice in the plan of replica {replica}")
        seen.add(slot)
        if slot not in held:
            raise ValueError(f"local policy: replica {replica} holds no request in slot {slot}")


class LocalPolicy(ABC):
    """Plan each step of a replica (see the module docstring)."""

    name = "local"

    @abstractmethod
    def plan(self, view: LocalView) -> StepPlan | None:
        """The next step's plan, or None for the engine's vLLM scheduler."""

    def compiled(self, replicas: int, gpus: int, max_seqs: int) -> CompiledPlan | None:
        """The plan function the compiled loop calls in place of `plan` (`commitenv.sim.local_compiled`), its arrays
        sized for ``replicas`` replicas on ``gpus`` GPUs whose steps hold at most ``max_seqs`` sequences; None (the
        default): the loop calls `plan` back on the host for each step."""
        return None


class FcfsLocal(LocalPolicy):
    """First come, first served over the replica's tasks in the engine's order (running, then waiting): the same
    steps as the vLLM scheduler as long as KV blocks suffice (it never preempts; on a shortage it skips)."""

    name = "fcfs"

    def plan(self, view: LocalView) -> StepPlan:
        return StepPlan(tuple(task.slot for task in view.tasks))
