"""Seeded multiplicative noise between the ground truth and the clean predictor (step time and energy)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NoiseSpec:
    """Log-normal, mean-one factors drawn once per scheduled segment (a step or a decode run).

    A run shares one draw across its steps, so the noise is correlated over a decode stretch as real
    step-time drift is (thermal state, memory contention); the default keeps the clean predictor's
    per-request latency error at a few percent, the range the ePACT paper reports (WAPE 0.4-4 %).
    """

    time_sigma: float = 0.03
    energy_sigma: float = 0.02

    def __post_init__(self) -> None:
        for name in ("time_sigma", "energy_sigma"):
            v = getattr(self, name)
            if not (0.0 <= v < 1.0):
                raise ValueError(f"noise.{name}: expected a value in [0, 1), got {v}")

    @property
    def off(self) -> bool:
        return self.time_sigma == 0.0 and self.energy_sigma == 0.0


class NoiseSource:
    """Per-replica streams of (time factor, energy factor), deterministic from the seed.

    Each stream's generator yields the factors in blocks of `_BLOCK`; a stream's sequence is the same whoever
    consumes it (the compiled kernel by `take` / `block` / `put_back`, the tests' reference engine by `draw`)."""

    _BLOCK = 4096

    def __init__(self, spec: NoiseSpec, seed: int, n_streams: int) -> None:
        self.spec = spec
        self._rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n_streams)]
        self._buf: list[list[tuple[float, float]]] = [[] for _ in range(n_streams)]  # next draw last

    def block(self, stream: int) -> np.ndarray:
        """The stream's next `_BLOCK` draws from its generator, in order: column 0 time, column 1 energy factors."""
        z = self._rngs[stream].standard_normal((self._BLOCK, 2))
        st, se = self.spec.time_sigma, self.spec.energy_sigma
        return np.column_stack((np.exp(st * z[:, 0] - 0.5 * st * st), np.exp(se * z[:, 1] - 0.5 * se * se)))

    def draw(self, stream: int) -> tuple[float, float]:
        buf = self._buf[stream]
        if not buf:
            buf.extend(map(tuple, self.block(stream)[::-1].tolist()))
        return buf.pop()

    def take(self, stream: int) -> np.ndarray:
        """The stream's drawn but unconsumed factors, in order (as `block`), handed over: the buffer is left empty."""
        buf, self._buf[stream] = self._buf[stream], []
        return np.array(buf[::-1], dtype=np.float64).reshape(-1, 2)

    def put_back(self, stream: int, draws: np.ndarray) -> None:
        """Factors (in order, as `block`) that the stream yields next, before any it still buffers."""
        self._buf[stream].extend(map(tuple, np.asarray(draws, np.float64)[::-1].tolist()))

    def copy(self) -> "NoiseSource":
        """A source with the same future draws (generator states and buffers copied)."""
        c = NoiseSource.__new__(NoiseSource)
        c.spec = self.spec
        c._rngs = [copy.deepcopy(r) for r in self._rngs]
        c._buf = [list(b) for b in self._buf]
        return c

    def draw_for(self, rep, t: float) -> tuple[float, float, float]:
        """Factors of a segment of replica ``rep`` starting at ``t``; they never change mid-segment (inf)."""
        ft, fe = self.draw(rep.index)
        return ft, fe, float("inf")
