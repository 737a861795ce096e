"""Live state of one arrived, unfinished request inside the engine."""

from __future__ import annotations

import numpy as np


class Req:
    """Progress of a request on its replica (vLLM V1 semantics: computed tokens, generated tokens, KV blocks).

    ``out`` is the length the engine runs to: the true output length in the ground truth, the predicted
    length inside a what-if copy. ``num_tokens = prompt + generated`` is what the scheduler must compute.
    """

    __slots__ = (
        "slot",
        "arrival",
        "prompt",
        "out",
        "computed",
        "generated",
        "blocks",
        "replica",
        "started",
        "deadline",
        "first_t",
        "last_t",
        "max_gap",
        "preemptions",
        "model",
        "captured",
        "hashes",
        "prefix",
        "pfx_next",
    )

    def __init__(self, slot: int, arrival: float, prompt: int, out: int, deadline: float, model: int = 0) -> None:
        self.slot = slot
        self.arrival = arrival
        self.prompt = prompt
        self.out = out
        self.computed = 0
        self.generated = 0
        self.blocks = 0
        self.replica = -1
        self.started = False
        self.deadline = deadline
        self.first_t = -1.0
        self.last_t = -1.0  # when its latest output token was produced (-1: none yet)
        self.max_gap = 0.0  # the longest gap between two consecutive output tokens so far
        self.preemptions = 0
        self.model = model
        self.captured = False
        self.hashes: tuple[int, ...] = ()  # shareable prefix-block hash ids (prefix caching), else empty
        self.prefix: list = []  # cached prefix entries this request references while it holds KV
        self.pfx_next = 0  # next hash block to register once computed

    def copy(self) -> "Req":
        r = Req.__new__(Req)
        for name in Req.__slots__:
            setattr(r, name, getattr(self, name))
        r.prefix = list(self.prefix)  # a copy's entries are remapped to the copy's cache by the replica
        return r

    def __repr__(self) -> str:
        return (
            f"Req(slot={self.slot}, prompt={self.prompt}, out={self.out}, computed={self.computed}, "
            f"generated={self.generated}, blocks={self.blocks}, replica={self.replica})"
        )


def live_state(live: list[Req]) -> tuple[np.ndarray, np.ndarray]:
    """(slot, tokens left to compute before the next output token) of each request in ``live``, in its order."""
    n = len(live)
    slots = np.fromiter((r.slot for r in live), np.int64, n)
    left = np.fromiter((r.prompt + r.generated - r.computed - (r.generated > 0) for r in live), np.int64, n)
    return slots, left
