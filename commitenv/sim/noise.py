"""Seeded multiplicative noise between the ground truth and the clean predictor (step time and energy)."""

from __future__ import annotations

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
    """Per-replica streams of (time factor, energy factor), deterministic from the seed."""

    _BLOCK = 4096

    def __init__(self, spec: NoiseSpec, seed: int, n_streams: int) -> None:
        self.spec = spec
        self._rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n_streams)]
        self._buf: list[list[tuple[float, float]]] = [[] for _ in range(n_streams)]

    def draw(self, stream: int) -> tuple[float, float]:
        buf = self._buf[stream]
        if not buf:
            z = self._rngs[stream].standard_normal((self._BLOCK, 2))
            st, se = self.spec.time_sigma, self.spec.energy_sigma
            ft = np.exp(st * z[:, 0] - 0.5 * st * st)
            fe = np.exp(se * z[:, 1] - 0.5 * se * se)
            buf.extend(zip(ft[::-1].tolist(), fe[::-1].tolist()))
        return buf.pop()

    def draw_for(self, rep, t: float) -> tuple[float, float, float]:
        """Factors of a segment of replica ``rep`` starting at ``t``; they never change mid-segment (inf)."""
        ft, fe = self.draw(rep.index)
        return ft, fe, float("inf")
