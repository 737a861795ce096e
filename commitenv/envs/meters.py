"""The meter a controller reads: per-GPU NVML-like energy counters (systematic per-GPU error, refresh lag and
1 mJ resolution), summed over the pool. Settlement reads the engine's energy (times the pool meter's overhead),
so what a controller measures and what it is billed for differ as they do in a real pool (docs/realism.md)."""

from __future__ import annotations

import math

import numpy as np

from commitenv.scenarios.realism import Meters
from commitenv.sim import Pool


class ControllerMeter:
    """Pool energy as the controller's counters report it at a decision boundary (exact at ``ideal``)."""

    def __init__(self, spec: Meters, n_gpus: int, seed: int) -> None:
        self.spec = spec
        self.exact = spec.gpu_bias == 0 and spec.update_s == 0 and spec.quantum_j == 0
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x6D6574]))  # "met"
        self.gain = 1.0 + rng.uniform(-spec.gpu_bias, spec.gpu_bias, n_gpus)  # per-GPU systematic error
        self.phase = rng.uniform(0.0, spec.update_s, n_gpus) if spec.update_s > 0 else np.zeros(n_gpus)
        self._last = np.zeros(n_gpus)

    def read(self, pool: Pool, t: float, interval_s: float) -> float:
        """Summed counter readings at ``t``. A counter refreshed every ``update_s`` shows the energy of its last
        refresh: the energy since then is taken off at the GPU's mean power over the last interval."""
        if self.exact:
            return pool.energy_j(t)
        e = pool.gpu_energy_j(t)
        sp = self.spec
        if sp.update_s > 0:
            lag = np.mod(t - self.phase, sp.update_s)
            power = (e - self._last) / interval_s if interval_s > 0 else np.zeros_like(e)
            self._last = e
            e = np.maximum(e - lag * power, 0.0)
        r = e * self.gain
        if sp.quantum_j > 0:
            r = np.floor(r / sp.quantum_j) * sp.quantum_j
        return float(math.fsum(r))
