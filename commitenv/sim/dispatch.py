"""Dispatch policies: which replica an arriving request joins (the engine calls one at every arrival, and again
for queued requests of a replica that is deactivated).

A policy sees only what a real router could know, as plain records (never engine objects): the request's
prompt length, predicted output length, visible deadline, model and prompt hash blocks, and for each active
replica of that model its queue, KV blocks, clock, SM share and, when the policy asks for them, how many of the
request's leading hash blocks the replica's prefix cache holds (``wants_prefix``) and its token loads: prefill
tokens still to compute and the summed context of its decoding requests (``wants_load``). It returns the
index of the chosen replica. The engine measures the time spent in policies (`Pool.dispatch_s`).

Without a policy the engine routes to the replica with the fewest unfinished requests, the first such on a tie
(`LeastUnfinished` makes the same choices, through the views).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple


class ArrivalView(NamedTuple):
    """An arriving request as a router sees it (immutable; a named tuple because one is built per arrival)."""

    slot: int
    t: float
    prompt_tokens: int
    predicted_output_tokens: int
    visible_deadline_s: float
    model: int
    prefix_blocks: int  # leading hash blocks of the prompt that a prefix cache could hold


class CandidateView(NamedTuple):
    """An active replica a request may join (immutable; one is built per candidate and arrival)."""

    index: int
    gpu: int
    unfinished: int  # running + waiting
    running: int
    waiting: int
    free_kv_blocks: int
    kv_blocks: int
    clock_mhz: int
    share: float
    cached_prefix_blocks: int  # of the arriving request's prefix blocks (0 unless the policy wants_prefix)
    block_tokens: int  # tokens per KV block
    queued_prefill_tokens: int  # prompt (and recompute) tokens not yet computed, over all requests (wants_load)
    decode_context_tokens: int  # summed context of the requests past their prefill (wants_load)


class DispatchPolicy(ABC):
    """Choose a replica for each arriving request. ``wants_prefix``: fill ``cached_prefix_blocks`` (costs a
    cache lookup per candidate); ``wants_load``: fill the token loads (costs a pass over each queue)."""

    name = "dispatch"
    wants_prefix = False
    wants_load = False

    @abstractmethod
    def choose(self, req: ArrivalView, replicas: tuple[CandidateView, ...]) -> int:
        """The ``index`` of the chosen replica (one of ``replicas``, never empty)."""


class LeastUnfinished(DispatchPolicy):
    """The engine's default router: fewest unfinished requests, first on a tie."""

    name = "least_unfinished"

    def choose(self, req: ArrivalView, replicas: tuple[CandidateView, ...]) -> int:
        best = replicas[0]
        for r in replicas:
            if r.unfinished < best.unfinished:
                best = r
        return best.index


class PrefixAffinity(DispatchPolicy):
    """Cache-aware routing as production routers do it (SGLang's cache-aware router, vLLM production-stack's
    prefix-aware routing): the replica holding the longest cached prefix of the prompt, unless that would
    unbalance load; then least unfinished.

    Balance rule: a replica qualifies when its unfinished count is at most ``max(slack, ratio * least)`` above
    the least loaded one's (``least``: the smallest unfinished count). Among qualifying replicas with at least
    one cached block the longest hit wins (fewest unfinished, then lowest index, on ties)."""

    name = "prefix_affinity"
    wants_prefix = True

    def __init__(self, slack: int = 4, ratio: float = 0.5) -> None:
        if slack < 0 or ratio < 0:
            raise ValueError(f"PrefixAffinity: slack and ratio must be >= 0, got {slack}, {ratio}")
        self.slack = int(slack)
        self.ratio = float(ratio)

    def choose(self, req: ArrivalView, replicas: tuple[CandidateView, ...]) -> int:
        least = min(r.unfinished for r in replicas)
        bound = least + max(self.slack, self.ratio * least)
        best = None
        for r in replicas:
            if r.cached_prefix_blocks > 0 and r.unfinished <= bound:
                if best is None or (r.cached_prefix_blocks, -r.unfinished) > (best.cached_prefix_blocks, -best.unfinished):
                    best = r
        if best is not None:
            return best.index
        return LeastUnfinished.choose(self, req, replicas)


POLICIES: dict[str, type[DispatchPolicy]] = {p.name: p for p in (LeastUnfinished, PrefixAffinity)}


def make_dispatch(name: str) -> DispatchPolicy | None:
    """The built-in policy ``name``; None for ``default`` and ``least_unfinished``, which the engine routes itself
    without building views (the same choices as `LeastUnfinished`)."""
    if name in ("default", "least_unfinished"):
        return None
    if name not in POLICIES:
        raise ValueError(f"dispatch: expected one of 'default', {', '.join(repr(k) for k in POLICIES)}, got {name!r}")
    return POLICIES[name]()
