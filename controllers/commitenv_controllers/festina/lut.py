"""Festina's offline-profiled look-up table (paper sec. 3.2.1): (frequency, SM share, input length) -> TTFT, TBT and
average power, with polynomial regression in the input length between grid points.

Here the "profiling" runs against a commitenv profile's step laws (`commitenv.sim.coeffs`) instead of a GPU. Each
grid point is one request alone on the instance:

* TTFT: the prefill steps of ``p`` tokens, in chunks of at most the scheduler's token budget (each chunk one step,
  attention history growing; the pairs sum to p(p+1)/2 however the prompt is chunked); the last chunk emits the
  first token, as in vLLM.
* TBT: one decode step of that request at context p+1 (n = 1, L = p+1).
* Power: energy / time of those steps, kept apart for prefill (``prefill_w``) and decode (``decode_w``); the step
  energy includes the GPU's idle floor over the step.

Between grid input lengths each metric is a least-squares polynomial per (clock, share) fitted in the input length
mapped onto [-1, 1] (`numpy.polynomial.Polynomial.fit`), weighted by 1/value so the residuals are relative.
Power is interpolated as fitted energy over fitted time, so power x time stays a polynomial like the law. At a grid
input length the profiled table value is returned unchanged. Clocks and shares must be grid values.

Chunked prefill (a token budget below the grid's longest prompt) adds one step's fixed cost per chunk, a jump a
polynomial smooths over (it then underestimates TTFT just past a chunk boundary). With ``chunk_term`` (the default)
the prefill fits also regress on the number of chunks ceil(p / budget), known to the scheduler; ``chunk_term=False``
is the paper's plain polynomial. The term is dropped when every grid length is one chunk.

Batch quantities the local scheduler needs (sec. 3.4) and the LUT does not hold (a batch of n decodes, a prompt off
the profiled range) come from the profile's laws directly: `decode_step_time`, `decode_step_energy`,
`prefill_time`, `prefill_energy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
from numpy.polynomial import Polynomial

from commitenv.profiles.schema import Profile
from commitenv.sim.coeffs import StepCoeffs, coeffs_for

DEFAULT_SHARES: tuple[float, ...] = tuple(round(0.1 * i, 10) for i in range(1, 11))  # paper: 10 %..100 %, step 10 %
DEFAULT_INPUT_LENS: tuple[int, ...] = (64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144,
                                       8192)
_SHARE_TOL = 1e-6

ArrayLike = Any  # a number or a numpy array of numbers


@dataclass(frozen=True)
class LutGrid:
    """The profiling grid: clock levels (MHz), SM shares (fractions of the GPU) and input lengths (tokens)."""

    clocks_mhz: tuple[int, ...]
    shares: tuple[float, ...]
    input_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("clocks_mhz", "shares", "input_lens"):
            vals = tuple(getattr(self, name))
            object.__setattr__(self, name, vals)
            if not vals:
                raise ValueError(f"LutGrid.{name}: empty")
            if any(b <= a for a, b in pairwise(vals)):
                raise ValueError(f"LutGrid.{name}: must be strictly ascending, got {list(vals)}")
        if any(int(c) != c or c <= 0 for c in self.clocks_mhz):
            raise ValueError(f"LutGrid.clocks_mhz: positive integers expected, got {list(self.clocks_mhz)}")
        if not all(0.0 < s <= 1.0 for s in self.shares):
            raise ValueError(f"LutGrid.shares: values in (0, 1] expected, got {list(self.shares)}")
        if any(int(p) != p or p < 1 for p in self.input_lens):
            raise ValueError(f"LutGrid.input_lens: positive integers expected, got {list(self.input_lens)}")
        if len(self.input_lens) < 2:
            raise ValueError(f"LutGrid.input_lens: at least two lengths needed to interpolate, "
                             f"got {list(self.input_lens)}")
        object.__setattr__(self, "clocks_mhz", tuple(int(c) for c in self.clocks_mhz))
        object.__setattr__(self, "shares", tuple(float(s) for s in self.shares))
        object.__setattr__(self, "input_lens", tuple(int(p) for p in self.input_lens))

    @staticmethod
    def default(profile: Profile) -> LutGrid:
        """Every clock level of the profile, the paper's 10 %-step shares allowed by the profile, and the default
        input lengths whose first decode step fits the context limit (for a context limit below them, eight
        lengths spread geometrically up to it)."""
        shares = tuple(s for s in DEFAULT_SHARES if s >= profile.sm_share.min_share - _SHARE_TOL)
        limit = profile.scheduler.context_limit
        lens = tuple(p for p in DEFAULT_INPUT_LENS if p + 1 <= limit)
        if len(lens) < 4:
            lens = tuple(sorted({int(round(x)) for x in np.geomspace(1, limit - 1, 8)}))
        return LutGrid(tuple(profile.clock_mhz), shares, lens)


class FestinaLUT:
    """Offline LUT of one model on one GPU type; arrays ``ttft_s``, ``tbt_s``, ``prefill_w``, ``decode_w`` are
    indexed [clock, share, input length] in grid order."""

    def __init__(self, profile: Profile, grid: LutGrid, degree: int, chunk_term: bool = True) -> None:
        if int(degree) != degree or degree < 1:
            raise ValueError(f"degree: a positive integer expected, got {degree}")
        budget = profile.scheduler.token_budget
        chunked = chunk_term and len({-(-p // budget) for p in grid.input_lens}) > 1
        need = degree + 1 + int(chunked)
        if need > len(grid.input_lens):
            raise ValueError(f"degree: {degree}{' with the chunk term' if chunked else ''} needs at least {need} grid "
                             f"input lengths, grid has {len(grid.input_lens)}")
        for c in grid.clocks_mhz:
            profile.clock_index(c)  # raises with the supported levels
        lo = profile.sm_share.min_share
        bad = [s for s in grid.shares if s < lo - _SHARE_TOL]
        if bad:
            raise ValueError(f"grid.shares: {bad} below the profile's sm_share.min_share {lo}")
        limit = profile.scheduler.context_limit
        if grid.input_lens[-1] + 1 > limit:
            raise ValueError(f"grid.input_lens: {grid.input_lens[-1]} + 1 exceeds the profile's context limit {limit}")

        self.profile_name: str = profile.name
        self.grid: LutGrid = grid
        self.degree: int = int(degree)
        self.chunk_term: bool = chunked
        self.token_budget: int = budget
        # one-time load of the model's weights (sec. 3.2.1): the profile's cold start, None where it is not profiled
        self.load_s: float | None = profile.latencies.load_s
        self.load_energy_j: float | None = profile.latencies.load_energy_j
        self._lens = np.asarray(grid.input_lens, dtype=np.float64)
        self._coeffs: dict[tuple[int, int], StepCoeffs] = {}
        nc, ns, npl = len(grid.clocks_mhz), len(grid.shares), len(grid.input_lens)
        shape = (nc, ns, npl)
        ttft, tbt, pre_w, dec_w, e_pre_t, e_dec_t = (np.empty(shape) for _ in range(6))
        self._fits: dict[tuple[int, int], tuple[_Fit, _Fit, _Fit, _Fit]] = {}
        p = self._lens
        for ci, mhz in enumerate(grid.clocks_mhz):
            idx = profile.clock_index(mhz)
            for si, s in enumerate(grid.shares):
                k = coeffs_for(profile, idx, s)
                self._coeffs[ci, si] = k
                t_pre, e_pre = _prefill(k, self.token_budget, p)
                t_dec, e_dec = k.step_time(0, 1, p + 1, 0), k.step_energy(0, 1, p + 1, 0)
                ttft[ci, si], tbt[ci, si] = t_pre, t_dec
                pre_w[ci, si], dec_w[ci, si] = e_pre / t_pre, e_dec / t_dec
                e_pre_t[ci, si], e_dec_t[ci, si] = e_pre, e_dec
                self._fits[ci, si] = (_Fit.of(p, t_pre, self.degree, budget if chunked else 0),
                                      _Fit.of(p, e_pre, self.degree, budget if chunked else 0),
                                      _Fit.of(p, t_dec, self.degree, 0), _Fit.of(p, e_dec, self.degree, 0))
        for a in (ttft, tbt, pre_w, dec_w, e_pre_t, e_dec_t):
            a.setflags(write=False)
        self.ttft_s, self.tbt_s, self.prefill_w, self.decode_w = ttft, tbt, pre_w, dec_w
        self._tables = (ttft, e_pre_t, tbt, e_dec_t)  # in `_fits` order: profiled values at grid lengths

    @classmethod
    def from_profile(cls, profile: Profile, grid: LutGrid | None = None, degree: int = 3,
                     chunk_term: bool = True) -> FestinaLUT:
        """Profile every grid point against ``profile``'s laws (default grid: `LutGrid.default`)."""
        return cls(profile, grid if grid is not None else LutGrid.default(profile), degree, chunk_term)

    # ------------------------------------------------------------------------------------------ grid look-up
    def clock_pos(self, clock_mhz: float) -> int:
        """Position of ``clock_mhz`` in the grid; ValueError listing the grid clocks otherwise."""
        for i, c in enumerate(self.grid.clocks_mhz):
            if float(clock_mhz) == c:
                return i
        raise ValueError(f"clock_mhz: {clock_mhz} is not a grid clock; valid values are {list(self.grid.clocks_mhz)}")

    def share_pos(self, share: float) -> int:
        """Position of ``share`` in the grid (to 1e-6); ValueError listing the grid shares otherwise."""
        for i, s in enumerate(self.grid.shares):
            if abs(float(share) - s) <= _SHARE_TOL:
                return i
        raise ValueError(f"share: {share} is not a grid SM share; valid values are {list(self.grid.shares)}")

    def coeffs(self, clock_mhz: float, share: float) -> StepCoeffs:
        """The profile's step-law coefficients at a grid clock and share."""
        return self._coeffs[self.clock_pos(clock_mhz), self.share_pos(share)]

    def _lens_in_range(self, input_len: ArrayLike) -> np.ndarray:
        p = np.asarray(input_len, dtype=np.float64)
        lo, hi = self.grid.input_lens[0], self.grid.input_lens[-1]
        if not np.all(np.isfinite(p)) or np.any(p < lo) or np.any(p > hi):
            bad = p[~(np.isfinite(p) & (p >= lo) & (p <= hi))]
            raise ValueError(f"input_len: {bad.ravel()[:4].tolist()} outside the profiled range [{lo}, {hi}]")
        return p

    def _query(self, clock_mhz: float, share: float, input_len: ArrayLike, which: int) -> ArrayLike:
        """Fitted metric ``which`` (0 prefill time, 1 prefill energy, 2 decode time, 3 decode energy); the
        profiled value at grid lengths."""
        ci, si = self.clock_pos(clock_mhz), self.share_pos(share)
        p = self._lens_in_range(input_len)
        out = np.asarray(self._fits[ci, si][which](p), dtype=np.float64)
        j = np.minimum(np.searchsorted(self._lens, p), len(self._lens) - 1)
        on = self._lens[j] == p
        if np.any(on):
            out = np.where(on, self._tables[which][ci, si][j], out)
        return float(out) if out.ndim == 0 else out

    # ------------------------------------------------------------------------------------------ LUT queries
    def ttft(self, clock_mhz: float, share: float, input_len: ArrayLike) -> ArrayLike:
        """Time to first token (s) of a request alone, prefill of ``input_len`` tokens."""
        return self._query(clock_mhz, share, input_len, 0)

    def tbt(self, clock_mhz: float, share: float, input_len: ArrayLike) -> ArrayLike:
        """Time between tokens (s): one decode step of the request alone at context input_len + 1."""
        return self._query(clock_mhz, share, input_len, 2)

    def prefill_power(self, clock_mhz: float, share: float, input_len: ArrayLike) -> ArrayLike:
        """Average power (W) over the prefill steps."""
        return self._query(clock_mhz, share, input_len, 1) / self._query(clock_mhz, share, input_len, 0)

    def decode_power(self, clock_mhz: float, share: float, input_len: ArrayLike) -> ArrayLike:
        """Average power (W) over the decode step at context input_len + 1."""
        return self._query(clock_mhz, share, input_len, 3) / self._query(clock_mhz, share, input_len, 2)

    def latency(self, clock_mhz: float, share: float, input_len: ArrayLike, output_len: ArrayLike) -> ArrayLike:
        """Latency(f, S, Req_in, Req_out) = TTFT + (output_len - 1) TBT (sec. 3.3), TBT at context input_len + 1."""
        d = _decodes(output_len)
        out = self.ttft(clock_mhz, share, input_len) + d * self.tbt(clock_mhz, share, input_len)
        return float(out) if np.ndim(out) == 0 else out

    def energy(self, clock_mhz: float, share: float, input_len: ArrayLike, output_len: ArrayLike) -> ArrayLike:
        """Festina's E^k = Power x Latency (sec. 3.3): prefill_w TTFT + decode_w (output_len - 1) TBT, in joules."""
        d = _decodes(output_len)
        out = self._query(clock_mhz, share, input_len, 1) + d * self._query(clock_mhz, share, input_len, 3)
        return float(out) if np.ndim(out) == 0 else out

    def power(self, clock_mhz: float, share: float, input_len: ArrayLike, output_len: ArrayLike = 1) -> ArrayLike:
        """Average power (W) over the whole request: energy / latency (the prefill power when output_len is 1)."""
        out = np.asarray(self.energy(clock_mhz, share, input_len, output_len)) / np.asarray(
            self.latency(clock_mhz, share, input_len, output_len))
        return float(out) if out.ndim == 0 else out

    def min_share(self, clock_mhz: float, input_len: float, ttft_budget_s: float | None = None,
                  tbt_budget_s: float | None = None) -> float | None:
        """Smallest grid SM share whose TTFT and TBT meet the given budgets at ``clock_mhz`` (None when none does):
        the local scheduler's minimum SM allocation of a task at frequency f (sec. 3.4)."""
        self.clock_pos(clock_mhz)
        if np.ndim(input_len) != 0:
            raise ValueError(f"input_len: a single length expected, got shape {np.shape(input_len)}")
        self._lens_in_range(input_len)
        for s in self.grid.shares:
            if ttft_budget_s is not None and self.ttft(clock_mhz, s, input_len) > ttft_budget_s:
                continue
            if tbt_budget_s is not None and self.tbt(clock_mhz, s, input_len) > tbt_budget_s:
                continue
            return s
        return None

    # ------------------------------------------------------------------------------------------ exact laws
    def prefill_time(self, clock_mhz: float, share: float, p: ArrayLike) -> ArrayLike:
        """Exact prefill time (s) of ``p`` tokens alone, chunked by the token budget (any p >= 1)."""
        t, _ = _prefill(self.coeffs(clock_mhz, share), self.token_budget, _positive(p, "p"))
        return float(t) if np.ndim(t) == 0 else t

    def prefill_energy(self, clock_mhz: float, share: float, p: ArrayLike) -> ArrayLike:
        """Exact prefill energy (J) of ``p`` tokens alone, chunked by the token budget (any p >= 1)."""
        _, e = _prefill(self.coeffs(clock_mhz, share), self.token_budget, _positive(p, "p"))
        return float(e) if np.ndim(e) == 0 else e

    def decode_step_time(self, clock_mhz: float, share: float, n: ArrayLike, L: ArrayLike) -> ArrayLike:
        """Exact time (s) of one decode step of a batch of ``n`` requests with summed context ``L``: the batch TBT."""
        k = self.coeffs(clock_mhz, share)
        out = k.step_time(0, np.asarray(n, dtype=np.float64), np.asarray(L, dtype=np.float64), 0)
        return float(out) if np.ndim(out) == 0 else out

    def decode_step_energy(self, clock_mhz: float, share: float, n: ArrayLike, L: ArrayLike) -> ArrayLike:
        """Exact energy (J) of one decode step of a batch of ``n`` requests with summed context ``L``."""
        k = self.coeffs(clock_mhz, share)
        out = k.step_energy(0, np.asarray(n, dtype=np.float64), np.asarray(L, dtype=np.float64), 0)
        return float(out) if np.ndim(out) == 0 else out


@dataclass(frozen=True)
class _Fit:
    """poly(p) + beta * ceil(p / budget); beta = 0 and no chunk column when budget is 0."""

    poly: Polynomial
    beta: float
    budget: int

    @staticmethod
    def of(p: np.ndarray, y: np.ndarray, degree: int, budget: int) -> _Fit:
        """Least squares with relative residuals (weights 1/y) in p mapped onto [-1, 1]."""
        if not budget:
            return _Fit(Polynomial.fit(p, y, degree, w=1.0 / y), 0.0, 0)
        lo, hi = float(p[0]), float(p[-1])
        x = (2 * p - (lo + hi)) / (hi - lo)
        V = np.column_stack([np.polynomial.polynomial.polyvander(x, degree), np.ceil(p / budget)])
        w = 1.0 / y
        A = V * w[:, None]
        scale = np.linalg.norm(A, axis=0)
        coef = np.linalg.lstsq(A / scale, y * w, rcond=None)[0] / scale
        return _Fit(Polynomial(coef[:-1], domain=[lo, hi], window=[-1, 1]), float(coef[-1]), budget)

    def __call__(self, p: np.ndarray) -> np.ndarray:
        out = self.poly(p)
        return out + self.beta * np.ceil(p / self.budget) if self.budget else out


def _prefill(k: StepCoeffs, budget: int, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Time and energy of prefilling ``p`` tokens alone: ceil(p/B) steps, P summing to p, A to p(p+1)/2."""
    p = np.asarray(p, dtype=np.float64)
    steps = np.ceil(p / budget)
    pairs = p * (p + 1) / 2
    return (steps * k.tau0 + k.tau1 * p + k.tau4 * pairs,
            steps * k.a + k.c1 * p + k.c2 * pairs)


def _positive(p: ArrayLike, name: str) -> np.ndarray:
    a = np.asarray(p, dtype=np.float64)
    if not np.all(np.isfinite(a)) or np.any(a < 1):
        raise ValueError(f"{name}: token counts >= 1 expected, got {a.ravel()[:4].tolist()}")
    return a


def _decodes(output_len: ArrayLike) -> np.ndarray:
    o = np.asarray(output_len, dtype=np.float64)
    if not np.all(np.isfinite(o)) or np.any(o < 1):
        raise ValueError(f"output_len: values >= 1 expected, got {o.ravel()[:4].tolist()}")
    return o - 1
