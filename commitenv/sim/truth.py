"""How the ground truth differs from the nominal profile: per-GPU static factors, slow thermal drift, per-cell
noise and stragglers on a fixed time grid, and per-request serving overheads (realism levels, docs/realism.md).

The what-if predictor never sees any of this: it models the nominal profile, so its error is model mismatch.

Factors are piecewise constant on a grid of ``cell_s`` seconds and a segment takes the factors of the cell its
start falls in; a closed-form decode run is cut at the first step end at or after the next cell boundary. A
step-by-step engine therefore draws exactly the same factors for every step, so the truth is the same with
``closed_form`` on or off (unlike the legacy per-segment `NoiseSource`, kept for the ``ideal`` level).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit


@dataclass(frozen=True)
class TruthSpec:
    """Magnitudes of the truth-versus-nominal differences (all off by default; see docs/realism.md)."""

    cell_s: float = 10.0  # grid of the time-varying factors (s)
    time_sigma: float = 0.0  # i.i.d. log-normal step-time noise per cell (mean one)
    energy_sigma: float = 0.0  # i.i.d. log-normal step-energy noise per cell (mean one)
    speed_sigma: float = 0.0  # static per-GPU step-time factor (log-normal, mean one), drawn per episode
    power_sigma: float = 0.0  # static per-GPU power factor (steps and idle floor), drawn per episode
    power_bias: float = 0.0  # the hardware draws (1 + power_bias) x what the predictor's energy model says
    drift_time_sigma: float = 0.0  # stationary sigma of the AR(1) thermal drift on step time (log scale)
    drift_energy_sigma: float = 0.0  # the same latent drift on step energy
    drift_tau_s: float = 600.0  # correlation time of the drift (s)
    straggler_prob: float = 0.0  # probability that a cell of a GPU runs slow (stragglers, tail steps)
    straggler_factor: float = 1.0  # step-time factor of a straggler cell
    overhead_s: float = 0.0  # mean per-request overhead outside the engine (tokenize, API, network, detokenize)
    overhead_cv: float = 0.0  # its coefficient of variation (log-normal)

    def __post_init__(self) -> None:
        checks = {
            "cell_s": self.cell_s > 0,
            "straggler_prob": 0 <= self.straggler_prob < 1,
            "straggler_factor": self.straggler_factor >= 1,
            "drift_tau_s": self.drift_tau_s > 0,
            "power_bias": -0.5 < self.power_bias < 1,
        }
        for name in ("time_sigma", "energy_sigma", "speed_sigma", "power_sigma", "drift_time_sigma",
                     "drift_energy_sigma", "overhead_s", "overhead_cv"):
            checks[name] = getattr(self, name) >= 0
        for name, ok in checks.items():
            v = getattr(self, name)
            if not (ok and math.isfinite(v)):
                raise ValueError(f"truth.{name}: value {v} out of range")

    @property
    def varies_in_time(self) -> bool:
        return (self.time_sigma > 0 or self.energy_sigma > 0 or self.drift_time_sigma > 0
                or self.drift_energy_sigma > 0 or self.straggler_prob > 0)


class NominalModel:
    """The predictor's view of the hardware inside a what-if copy: nominal speed, energy scaled by
    ``energy_factor`` (1 / (1 + power_bias): the predictor's energy model reads low by the truth's bias)."""

    __slots__ = ("energy_factor",)

    def __init__(self, energy_factor: float) -> None:
        self.energy_factor = float(energy_factor)

    def draw_for(self, rep, t: float) -> tuple[float, float, float]:
        return 1.0, self.energy_factor, math.inf


@njit(cache=True)
def _ar1(z: np.ndarray, prev: float, rho: float, s: float) -> np.ndarray:
    """x[i] = rho x[i-1] + s z[i] from x[-1] = ``prev`` (the drift's AR(1) recursion, compiled)."""
    x = np.empty(z.shape[0])
    for i in range(z.shape[0]):
        prev = rho * prev + s * z[i]
        x[i] = prev
    return x


def _lognormal_mean_one(rng: np.random.Generator, sigma: float, size) -> np.ndarray:
    return np.exp(sigma * rng.standard_normal(size) - 0.5 * sigma * sigma)


class TruthSource:
    """Deterministic per-GPU factors from ``seed``: static speed and power, and per-cell (time, energy) factors
    generated lazily in blocks, each GPU from its own stream (so access order never changes the draws)."""

    _BLOCK = 1024

    def __init__(self, spec: TruthSpec, seed: int, n_gpus: int) -> None:
        self.spec = spec
        root = np.random.SeedSequence([int(seed), 0x7275_7468])  # "truth"
        static_ss, drift_ss, self._overhead_ss, *gpu_ss = root.spawn(n_gpus + 3)
        srng = np.random.default_rng(static_ss)
        self.speed = _lognormal_mean_one(srng, spec.speed_sigma, n_gpus)
        self.power = _lognormal_mean_one(srng, spec.power_sigma, n_gpus)
        self._rngs = [np.random.default_rng(s) for s in gpu_ss]
        self._ft: list[list[float]] = [[] for _ in range(n_gpus)]  # Python floats: read once per segment
        self._fe: list[list[float]] = [[] for _ in range(n_gpus)]
        self._cell = float(spec.cell_s)
        self._tab: np.ndarray | None = None  # (2, GPUs, capacity): `factor_tables`' cache, cells [0, _tab_n) filled
        self._tab_n = 0
        self._x = np.zeros(n_gpus)  # latent drift state at the end of the generated cells (stationary start)
        if spec.drift_time_sigma > 0 or spec.drift_energy_sigma > 0:
            self._x = np.random.default_rng(drift_ss).standard_normal(n_gpus)
        self._rho = math.exp(-spec.cell_s / spec.drift_tau_s)

    def _extend(self, g: int, upto: int) -> None:
        sp = self.spec
        rng = self._rngs[g]
        while len(self._ft[g]) <= upto:
            n = self._BLOCK
            z = rng.standard_normal((n, 3))
            u = rng.random(n)
            # AR(1) latent drift with unit stationary variance
            x = _ar1(z[:, 2].copy(), self._x[g], self._rho, math.sqrt(1.0 - self._rho * self._rho))
            self._x[g] = x[-1]
            dt, de = sp.drift_time_sigma, sp.drift_energy_sigma
            ft = np.exp(sp.time_sigma * z[:, 0] - 0.5 * sp.time_sigma ** 2 + dt * x - 0.5 * dt * dt)
            fe = np.exp(sp.energy_sigma * z[:, 1] - 0.5 * sp.energy_sigma ** 2 + de * x - 0.5 * de * de)
            if sp.straggler_prob > 0:
                ft = np.where(u < sp.straggler_prob, ft * sp.straggler_factor, ft)
            self._ft[g].extend((ft * self.speed[g]).tolist())
            self._fe[g].extend((fe * self.speed[g] * self.power[g]).tolist())

    def factor_tables(self, upto: int) -> tuple[np.ndarray, np.ndarray]:
        """(time, energy) factors of cells [0, ``upto``) of every GPU as (GPUs, cells) arrays, the compiled engine's
        tables: views of one growing cache that every copy of a pool shares (cells never change once drawn)."""
        n = len(self._ft)
        have = self._tab_n
        if upto > have:
            for g in range(n):
                self._extend(g, upto)
            tab = self._tab
            if tab is None or upto > tab.shape[2]:
                new = np.empty((2, n, max(upto, 2 * (0 if tab is None else tab.shape[2]))))
                if have:
                    new[:, :, :have] = tab[:, :, :have]
                tab = self._tab = new
            tab[0, :, have:upto] = [f[have:upto] for f in self._ft]
            tab[1, :, have:upto] = [f[have:upto] for f in self._fe]
            self._tab_n = upto
        return self._tab[0, :, :upto], self._tab[1, :, :upto]

    def draw(self, stream: int, t: float) -> tuple[float, float, float]:
        """(time factor, energy factor, end of the cell) for a segment of GPU ``stream`` starting at ``t``.

        A slower GPU also runs each step longer at the same power, so its energy factor carries the speed
        factor too (energy = power x time)."""
        cell = self._cell
        k = int(t // cell)
        ft = self._ft[stream]
        if k >= len(ft):
            self._extend(stream, k)
        return ft[k], self._fe[stream][k], (k + 1) * cell

    def draw_for(self, rep, t: float) -> tuple[float, float, float]:
        """Factors of a segment of replica ``rep`` (its GPU's cell factors) starting at ``t``."""
        return self.draw(rep.gpu.index, t)

    def overhead_rng(self) -> np.random.Generator:
        """The generator of the per-request overheads, at its start (a pool keeps it to draw later requests' on)."""
        return np.random.default_rng(self._overhead_ss)

    def request_overheads(self, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """Per-request overhead (s) outside the engine, log-normal with the spec's mean and CV; drawn from ``rng`` when
        given (continuing it: parts drawn one after another equal one draw of them all), else from the start."""
        sp = self.spec
        if sp.overhead_s <= 0:
            return np.zeros(n)
        rng = self.overhead_rng() if rng is None else rng
        s2 = math.log1p(sp.overhead_cv ** 2)
        return sp.overhead_s * np.exp(math.sqrt(s2) * rng.standard_normal(n) - 0.5 * s2)
