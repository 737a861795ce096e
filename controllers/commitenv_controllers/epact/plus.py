"""ePACT+ (``epact_plus``): ePACT's local decision maker with a forecast-aware global planner.

ePACT's planner (sec. 4.2) scales a nominal allocation b_k, T_k = b_k (E* - M_k) / (E* - B_k), and the paper
uses the equal split b_k = E*/K. Here b_k follows the energy the remaining intervals of the hour are forecast to
need, so that T_k follows the load instead of the equal split. The local decision maker (search, SLO gate,
target matching, energy band) is ePACT's; what it is given differs in one way: the what-if energies are
calibrated on the meter (step 5).

At every decision (interval k of the hour, time t):

1. **Load forecast** (causal: only ``probe.recent_arrivals``). Arrivals of the last ``trend_window_s`` are
   counted per interval and fitted by least squares with a line (level at t, slope per interval). Per-minute
   counts at realism ``paper`` are noisy (renewal CV 2 and minute bursts of log-sigma 0.21 with lag-one
   correlation 0.5), so the slope is shrunk by its own standard error: slope * s^2 / (s^2 + shrink * se^2)
   (James-Stein-like; a slope within its noise goes to about zero). The forecast of interval j is
   max(level + slope (j - k + 1/2), 0) requests.
2. **Energy forecast** from the pool's nominal profile (`dynamollm.ClockLaws`, `arrivals_work`): per request,
   the replica-seconds and the step energy above the active-idle floor at the top clock, with decode steps
   shared by the snapshot's concurrency per active replica. For lambda requests in an interval of dt seconds,
   n = clip(lambda * busy / (dt * util), 1, N) replicas are busy and the energy is
   dt (n P_idle + (N - n) P_standby) + lambda e_dyn: the idle floor of the replicas needed plus the work.
3. **Allocation** (`forecast_allocation`): the k elapsed intervals keep E*/K each, the remaining nominal mass
   E* (K - k) / K is split in proportion to the forecast energies (times the optional ``tilt`` ramp), so
   T_k = (E* - M_k) f_k / sum_{j >= k} f_j. A flat forecast gives `planner.equal_allocation` exactly, and then
   (with ``calibrate=False``) the controller's actions are ePACT's bit for bit (``forecast="flat"`` forces that).
4. **Capacity cap** (``capacity_cap``, with ``forecast="load"``): budget planned for a later interval beyond
   what the pool can draw there (all replicas at the top clock: dt N P_idle + lambda e_dyn, scaled by the
   median metered / modelled ratio of the last hour's intervals that ran so) cannot be spent; `capped_targets`
   caps those intervals and gives the excess to the others (water filling, the current interval uncapped).
   The caps take lambda no higher than the current level nor the mean of the fitted window: a load rise (or a
   burst the trend reads as one) must not promise later capacity, since energy left unspent now cannot be spent
   back once the pool is full (bench-h200-day, seed 100001, hour 0: the load rose for 30 min and fell back).
   With ``calibrate``, the caps are also scaled by `cap_scale`: the sum of metered over the sum of predicted cap
   energy of the intervals (last hour) that ran the full pool at the top clock, so that the level and the
   model's bias average out as they do over the later intervals the caps bound.
5. **Energy calibration** (``calibrate``, `EnergyCalibration`): every what-if energy prediction is multiplied by
   the ratio of metered interval energy to the raw prediction of the candidates applied before, learned per
   clock level (a clock not applied yet takes the pooled ratio), exponentially weighted and clipped as MPC's.
   Why: the what-if copy runs the nominal profile, which the hardware does not (at realism ``paper`` the truth
   draws above the energy model, the meter adds its GPU bias, and the ratio differs by clock), so ePACT
   overshoots every interval's target and the feedback piles the overuse into the hour's last intervals.
   Causal (the meter of ended intervals); it carries over hours. Figures: docs/results/baselines.md.
6. **Hour-end cost** (``hour_end_weight`` W, ``cap_margin`` m; `hour_end_cost`): candidates are ranked by
   eq. 3 plus W times the hour's settlement if the later intervals draw as close to the rest of the commitment
   as they can, i.e. between a floor and (1 - m) times the capped draw. The floor of a later interval is the
   least energy the SLO gate admitted at the last decision (the pool's least draw, `EnergyModel.min_energy`,
   if that is lower; never above the margined cap): overuse is recoverable only down to what the deadlines
   allow (on the H20 pool, where the gate admits little below the full pool, a floor without the SLO
   called overuse recoverable that was not, and the day's cost rose). Why: eq. 3 prices a
   deviation now as if it were settled now, but only the hour is settled: overuse now is recoverable while the
   later intervals can draw less than their targets, underuse now only while they can draw more. Where the
   commitment is about what the full pool draws, eq. 3's 2 : 1 weights pick a smaller configuration whenever
   a burst makes the full pool look expensive, and the energy left unspent is lost at the hour's end. The
   margin m keeps the caps' errors (bursts, the level) on the safe side: planning too little later capacity
   only moves consumption earlier, which the later intervals recover. Inactive (zero) wherever the later
   intervals can absorb the deviation; in the hour's last interval it is W x eq. 3 (same ranking).

7. **Miss margin** (``miss_margin``, off by default; `miss_margin.MissMargin`): the SLO gate counts a request as a miss when
   its predicted slack (deadline - predicted finish) is below a margin, the margin being the quantile of the
   applied candidates' predicted slacks (last hour) at the miss rate observed after them (late completions per
   arrival): the margin at which the gate's predictions of the applied configurations would have matched the
   misses the hardware made. Why: the what-if copy runs the nominal profile, and the hardware's slower steps,
   stragglers and serving overheads turn requests it predicts just in time into misses (bench-h200-day hours 7-11,
   seed 100000: the applied candidates' predicted misses were 0 while 1.4 % of requests missed, most by less than
   0.1 s), so the gate with epsilon alone admitted configurations whose real misses exceed epsilon. Causal
   (``new_misses`` of ended intervals, ``probe.recent_arrivals``). Off by default: it buys service with energy,
   which the issue's cost goal does not price (docs/results/baselines.md).

Not used: the hourly commitments as a shape prior across hours. On bench-h200-day the commitments are
gamma_h x E_hist_h with fractions gamma_h that jump between hours (e.g. 1.00 -> 0.85 from hour 4 to 5), so
E*_{h+1} / E*_h mixes those jumps into the load shape: hour 4 -> 5 the commitments fall by 22 % while the
reference energy falls by 8 %; hour 12 -> 13 they rise by 26 % against 12.5 %.

``tilt`` (default 0: off) multiplies the forecast by the ramp 1 + tilt (2 (j + 1/2) / K - 1) over the hour's
intervals, holding budget back for the hour's end whatever the load does. Why (measured at realism ``paper``,
bench-h200-hour-fixed-a30 = hour 12 of the day, load rising about 50 % through the hour, and the same hour 7,
load falling about 30 %; ePACT with a fixed linear nominal ramp, train seeds): ePACT's cost falls with a rising
ramp on *both* hours (hour 12, seeds 1-3: 0.166 kWh-eq flat, 0.089 at tilt 0.2, 0.081 at 0.3; hour 7, seeds 1-2:
0.141 flat, 0.082 at 0.2) and rises with a falling one (0.238 and 0.248 at -0.2), and attainment rises with it;
at 0.5 attainment drops by about 1.2 pp. So the gain of a back-loaded allocation is not load following: the
metered interval energy overshoots the target systematically (hour 12, seed 100000: in 57 of 59 intervals;
the predictor's energy model reads 15.5 % low at ``paper``, and with that bias set to 0 the ramp still cuts the
cost, 0.081 -> 0.046 on seeds 1-2), the feedback pushes the accumulated overuse into the last intervals, whose
targets then fall below the energy the pool cannot avoid (107 and 12 kJ against about 180 kJ there), and
overuse costs lambda_plus = 2 x lambda_minus. Holding budget for the end keeps those targets feasible. The load
forecast alone moves b_k the same way only on rising hours (hour 7, seeds 1-2: 0.158 against ePACT's 0.141).
Where the commitment is at or above what the pool can draw, budget held back cannot be spent later: the capacity
cap (step 4) limits that loss, but not fully (bench-h200-day, seed 100000: ePACT 2.848 kWh-eq; tilt 0.2 without
the cap 2.683, with it 2.182, both at ePACT's attainment within 0.01 pp).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from commitenv.sim.whatif import WhatIf
from commitenv_controllers.base import ControllerContext
from commitenv_controllers.dynamollm import ClockLaws, arrivals_work
from commitenv_controllers.epact.controller import EPACT
from commitenv_controllers.epact.miss_margin import MissMargin
from commitenv_controllers.epact.planner import check_allocation, equal_allocation
from commitenv_controllers.epact.selection import deviation_cost
from commitenv_controllers.registry import register

CAL_MIN, CAL_MAX = 0.75, 1.33  # the calibration's bounds (as MPC's): a ratio beyond them is a transient, not a bias


@dataclass
class EnergyCalibration:
    """Metered / what-if predicted interval energy of applied candidates (module docstring, step 5): a pooled
    ratio and one per clock level, each exponentially weighted (weight 1/2, 1/3, ... down to ``weight``) and
    clipped to [CAL_MIN, CAL_MAX]; a clock not applied yet takes the pooled ratio."""

    weight: float
    pooled: float = 1.0
    n: int = 0
    by_clock: dict[int, tuple[float, int]] = field(default_factory=dict)  # clock -> (ratio, observations)

    def scale(self, clock_mhz: int) -> float:
        s = self.by_clock.get(int(clock_mhz))
        return self.pooled if s is None else s[0]

    def _step(self, value: float, n: int, ratio: float) -> float:
        w = max(self.weight, 1.0 / (n + 2))
        return min(max((1.0 - w) * value + w * ratio, CAL_MIN), CAL_MAX)

    def update(self, clock_mhz: int, ratio: float) -> None:
        value, m = self.by_clock.get(int(clock_mhz), (self.pooled, 0))
        self.by_clock[int(clock_mhz)] = (self._step(value, m, ratio), m + 1)
        self.pooled = self._step(self.pooled, self.n, ratio)
        self.n += 1


# ============================================================================================= allocation
def forecast_allocation(commitment: float, K: int, k: int, forecast: Sequence[float]) -> list[float]:
    """b_0..b_{K-1} for a decision at interval ``k``: the k elapsed intervals keep E*/K each, the remaining
    nominal mass E* - k E*/K is split in proportion to ``forecast`` (one value per remaining interval,
    non-negative, the last positive). A flat forecast (all values equal) returns `equal_allocation` exactly.

    With `planner.interval_target` this gives T_k = (E* - M_k) f_k / sum_{j >= k} f_j: only the shape of the
    remaining forecast matters, the feedback on measured consumption is ePACT's."""
    if not 0 <= k < K:
        raise ValueError(f"interval index {k} outside 0..{K - 1}")
    f = [float(x) for x in forecast]
    if len(f) != K - k:
        raise ValueError(f"forecast: expected {K - k} values (intervals {k}..{K - 1}), got {len(f)}")
    if any(not math.isfinite(x) or x < 0 for x in f) or f[-1] <= 0:
        raise ValueError("forecast: values must be finite and >= 0, the last one > 0")
    if all(x == f[0] for x in f):
        return equal_allocation(commitment, K)
    elapsed = [commitment / K] * k
    remaining = commitment - float(sum(elapsed))
    total = float(sum(f))
    return elapsed + [remaining * x / total for x in f]


def capped_targets(remaining: float, weights: Sequence[float], caps: Sequence[float]) -> list[float]:
    """Split ``remaining`` energy over the hour's remaining intervals in proportion to ``weights``, with every
    later interval (index >= 1) capped at ``caps`` (what the pool can consume there); what a cap cuts goes to
    the uncapped intervals in proportion to their weights (water filling), the current interval (index 0)
    never capped. Returns the targets (they sum to ``remaining``); ``remaining <= 0`` splits without caps."""
    w = [float(x) for x in weights]
    n = len(w)
    if n == 0 or len(caps) != n:
        raise ValueError("capped_targets: weights and caps must have the same, positive length")
    total = sum(w)
    if remaining <= 0 or total <= 0:
        return [remaining * x / total for x in w] if total > 0 else [remaining / n] * n
    fixed: dict[int, float] = {}
    while True:
        free = [j for j in range(n) if j not in fixed]
        left = remaining - sum(fixed.values())
        wf = sum(w[j] for j in free)
        if wf <= 0:  # every free weight is zero: the current interval takes what is left
            t = [fixed.get(j, 0.0) for j in range(n)]
            t[0] += left
            return t
        t = [fixed[j] if j in fixed else left * w[j] / wf for j in range(n)]
        over = [j for j in free if j >= 1 and t[j] > caps[j]]
        if not over:
            return t
        for j in over:
            fixed[j] = float(caps[j])


# ============================================================================================= forecast
@dataclass(frozen=True)
class LoadTrend:
    """A line fitted to recent per-interval arrival counts: requests per interval at ``now`` and its slope per
    interval (already shrunk), from ``bins`` whole intervals; ``raw_slope`` and ``se`` before shrinking."""

    level: float
    slope: float
    bins: int
    raw_slope: float = 0.0
    se: float = 0.0

    @property
    def mean(self) -> float:
        """Requests per interval averaged over the fitted window (the line's value at the window's centre)."""
        return self.level - self.slope * self.bins / 2.0

    def forecast(self, n: int) -> np.ndarray:
        """Requests in each of the next ``n`` intervals (centres at 1/2, 3/2, ... intervals from now), >= 0."""
        return np.maximum(self.level + self.slope * (np.arange(n) + 0.5), 0.0)


def interval_counts(ages_s: np.ndarray, window_s: float, interval_s: float) -> np.ndarray:
    """Arrivals per whole interval of the last ``window_s`` seconds, oldest first (``ages_s``: now - arrival)."""
    n = int(window_s // interval_s + 1e-9)
    if n <= 0:
        return np.zeros(0)
    idx = np.floor(np.asarray(ages_s, dtype=np.float64) / interval_s).astype(np.int64)
    idx = idx[(idx >= 0) & (idx < n)]
    return np.bincount(idx, minlength=n)[:n][::-1].astype(np.float64)


def fit_trend(counts: np.ndarray, shrink: float, min_bins: int) -> LoadTrend:
    """Least-squares line through ``counts`` (oldest first, bin i centred i + 1/2 - n intervals from now), the
    slope shrunk by its standard error: slope s^2 / (s^2 + shrink se^2); fewer than ``min_bins`` bins give
    a flat trend at their mean."""
    y = np.asarray(counts, dtype=np.float64)
    n = len(y)
    if n == 0:
        return LoadTrend(0.0, 0.0, 0)
    if n < max(min_bins, 3):
        return LoadTrend(float(y.mean()), 0.0, n)
    x = np.arange(n) - n + 0.5
    xm, ym = float(x.mean()), float(y.mean())
    sxx = float(((x - xm) ** 2).sum())
    b = float(((x - xm) * (y - ym)).sum() / sxx)
    resid = y - (ym + b * (x - xm))
    se = math.sqrt(float((resid**2).sum()) / (n - 2) / sxx)
    denom = b * b + shrink * se * se
    bs = b * b * b / denom if denom > 0 else 0.0
    return LoadTrend(ym - bs * xm, bs, n, b, se)


@dataclass(frozen=True)
class EnergyModel:
    """Interval energy (J) of lambda arrivals from the nominal profile (module docstring, step 2)."""

    interval_s: float
    n_replicas: int
    idle_w: float  # active-idle power at the top clock
    standby_w: float
    busy_s: float  # replica-seconds per request at the top clock
    dyn_j: float  # step energy per request above the active-idle floor
    util: float
    min_idle_w: float = 0.0  # active-idle power at the lowest clock (the pool's smallest configuration)

    @staticmethod
    def of(laws: ClockLaws, recent: Any, interval_s: float, n_replicas: int, batch: float,
           util: float) -> "EnergyModel | None":
        """The model for the requests of ``recent`` (None when there are none)."""
        if recent is None or len(recent) == 0:
            return None
        busy, energy = arrivals_work(recent, laws, batch)
        top = laws.top
        n = len(recent)
        idle = float(laws.idle_w[top])
        return EnergyModel(interval_s, n_replicas, idle, laws.standby_w, float(busy[top]) / n,
                           max(float(energy[top]) - idle * float(busy[top]), 0.0) / n, util,
                           float(np.min(laws.idle_w)))

    def energy(self, lam: np.ndarray) -> np.ndarray:
        lam = np.asarray(lam, dtype=np.float64)
        n = np.clip(lam * self.busy_s / (self.interval_s * self.util), 1.0, float(self.n_replicas))
        floor = self.interval_s * (n * self.idle_w + (self.n_replicas - n) * self.standby_w)
        return floor + lam * self.dyn_j

    def max_energy(self, lam: np.ndarray) -> np.ndarray:
        """Energy with every replica active at the top clock (the most the pool draws for that load)."""
        lam = np.asarray(lam, dtype=np.float64)
        return self.interval_s * self.n_replicas * self.idle_w + lam * self.dyn_j

    def min_energy(self, n: int) -> np.ndarray:
        """A lower bound of the pool's energy in each of ``n`` intervals: one replica active and idle at the lowest
        clock, the others on standby. The load's work is left out: its energy per request falls with the clock
        (the top clock's ``dyn_j`` would overstate it), and a bound too high would call recoverable overuse lost."""
        return np.full(n, self.interval_s * (self.min_idle_w + (self.n_replicas - 1) * self.standby_w))


def cap_scale(pairs: Sequence[tuple[float, float]]) -> float:
    """Sum of metered over sum of uncalibrated capped energy of the intervals that ran the full pool at the top
    clock (ratio of sums: bursts average out, as they do over the later intervals the caps bound), clipped to
    [CAL_MIN, CAL_MAX]; 1 without any."""
    if not pairs:
        return 1.0
    return min(max(sum(m for m, _ in pairs) / sum(c for _, c in pairs), CAL_MIN), CAL_MAX)


def capacity_caps(model: EnergyModel, trend: LoadTrend, n: int, ratio: float) -> np.ndarray:
    """The most energy the pool can draw in each of the next ``n`` intervals (step 4): every replica at the top
    clock, scaled by the metered / modelled ``ratio``, with a load no higher than the current level nor the
    window's mean (a rise seen so far is not counted on: loads that rise within an hour also fall back)."""
    return ratio * model.max_energy(np.minimum(trend.forecast(n), max(min(trend.level, trend.mean), 0.0)))


def hour_end_cost(commitment: float, hour_energy: float, target: float, cap_later: float, floor_later: float,
                  lambda_plus: float, lambda_minus: float, weight: float) -> Callable[[float], float]:
    """J(E) = eq. 3 (E against ``target``) + ``weight`` x the hour's settlement if the later intervals draw
    as close to the rest of the commitment as they can, between ``floor_later`` and ``cap_later`` (step 6):
    lambda_plus [M + E + floor_later - E*]+ + lambda_minus [E* - M - E - cap_later]+."""
    def cost(energy: float) -> float:
        over = hour_energy + energy + floor_later - commitment
        under = commitment - hour_energy - energy - cap_later
        return deviation_cost(energy, target, lambda_plus, lambda_minus) + weight * (
            lambda_plus * max(over, 0.0) + lambda_minus * max(under, 0.0))
    return cost


# ============================================================================================= controller
@register("epact_plus")
class EPACTPlus(EPACT):
    """ePACT with b_k from forecast energy of the hour's remaining intervals (module docstring).

    Parameters beyond ePACT's (``workers``, ``planning_delay``, ``warm_starts``, ``replay_window_s``,
    ``max_tail_s``, ``slo_scope``, ``energy_band``: see `EPACT`): ``forecast`` (``"load"``: the load and energy
    forecast; ``"flat"``: the equal split, i.e. ePACT), ``trend_window_s`` (arrivals fitted, s), ``shrink``
    (slope shrinkage by its standard error), ``min_bins`` (whole intervals needed to fit a slope), ``util``
    (busy share of a replica the energy model counts as needed), ``tilt`` (ramp that holds budget back for the
    hour's end, 0 = off), ``capacity_cap`` (cap later intervals' planned energy at the pool's maximum),
    ``calibrate`` and ``calibration_weight`` (the what-if energy calibration on the meter, step 5),
    ``hour_end_weight`` and ``cap_margin`` (the hour-end cost, step 6; weight 0 = eq. 3), ``miss_margin``
    (the SLO gate counts predicted slacks below a margin calibrated on the misses observed, step 7)."""

    def __init__(
        self,
        workers: int | None = None,
        planning_delay: float | Literal["measured"] = 0.0,
        warm_starts: int = 3,
        replay_window_s: float | None = None,
        max_tail_s: float = 3600.0,
        slo_scope: Literal["captured", "captured+forecast"] = "captured+forecast",
        energy_band: float | Literal["measured"] = "measured",
        forecast: Literal["load", "flat"] = "load",
        trend_window_s: float = 1800.0,
        shrink: float = 4.0,
        min_bins: int = 5,
        util: float = 0.85,
        tilt: float = 0.0,
        capacity_cap: bool = True,
        calibrate: bool = True,
        calibration_weight: float = 0.2,
        hour_end_weight: float = 4.0,
        cap_margin: float = 0.1,
        miss_margin: bool = False,
    ) -> None:
        super().__init__(workers=workers, planning_delay=planning_delay, warm_starts=warm_starts,
                         replay_window_s=replay_window_s, max_tail_s=max_tail_s, slo_scope=slo_scope,
                         energy_band=energy_band)
        if forecast not in ("load", "flat"):
            raise ValueError(f"forecast: expected 'load' or 'flat', got {forecast!r}")
        if not (trend_window_s > 0 and math.isfinite(trend_window_s)):
            raise ValueError(f"trend_window_s: expected seconds > 0, got {trend_window_s!r}")
        if not (shrink >= 0 and math.isfinite(shrink)):
            raise ValueError(f"shrink: expected >= 0, got {shrink!r}")
        if min_bins < 3:
            raise ValueError(f"min_bins: expected >= 3 (a line and its error need them), got {min_bins!r}")
        if not 0 < util <= 1:
            raise ValueError(f"util: expected a share in (0, 1], got {util!r}")
        if not (-1 < tilt < 1):
            raise ValueError(f"tilt: expected -1 < tilt < 1, got {tilt!r}")
        if not 0 < calibration_weight <= 1:
            raise ValueError(f"calibration_weight: expected a weight in (0, 1], got {calibration_weight!r}")
        if not (hour_end_weight >= 0 and math.isfinite(hour_end_weight)):
            raise ValueError(f"hour_end_weight: expected a weight >= 0, got {hour_end_weight!r}")
        self.forecast_mode = forecast
        self.trend_window_s = float(trend_window_s)
        self.shrink = float(shrink)
        self.min_bins = int(min_bins)
        self.util = float(util)
        self.tilt = float(tilt)
        self.capacity_cap = bool(capacity_cap)
        self.calibrate = bool(calibrate)
        self.calibration_weight = float(calibration_weight)
        self.hour_end_weight = float(hour_end_weight)
        if not 0 <= cap_margin < 1:
            raise ValueError(f"cap_margin: expected a share in [0, 1), got {cap_margin!r}")
        self.cap_margin = float(cap_margin)
        self.miss_margin = bool(miss_margin)

    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        self.laws: ClockLaws | None = None
        if self.forecast_mode == "load":
            if ctx.profile is None:
                raise ValueError("epact_plus needs the pool's profile (ControllerContext.profile) for its energy "
                                 "forecast; forecast='flat' runs without it")
            self.laws = ClockLaws.of(ctx.profile)
        self.forecasts: list[dict[str, Any]] = []
        self.max_ratios: deque[float] = deque(maxlen=ctx.intervals_per_hour)  # metered / modelled, all at top
        self._caps: np.ndarray | None = None
        self._floors: np.ndarray | None = None
        self.calibration = EnergyCalibration(self.calibration_weight)  # step 5
        self.cap_meter: deque[tuple[float, float]] = deque(maxlen=ctx.intervals_per_hour)  # (metered, raw cap)
        self._cap_now: float | None = None  # the uncalibrated cap of the interval now starting
        self.gate = MissMargin(ctx.intervals_per_hour)  # step 7

    def calibrate_energy(self, info: dict[str, Any]) -> None:
        """Step 5: learn the ratio of the last interval's metered energy to the raw what-if prediction of the
        candidate applied there (``calibrate`` off: nothing)."""
        last = self.decisions[-1] if self.decisions else None
        predicted = self._predicted_j  # the applied candidate's prediction, calibrated when it was made
        metered = info.get("interval_energy_j")
        if (not self.calibrate or last is None or last["chosen"] is None or predicted is None or predicted <= 0
                or metered is None or float(metered) <= 0):
            return
        self.calibration.update(int(last["chosen"][1]), float(metered) * last["energy_scale"] / predicted)

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        if self.miss_margin:
            self._calibrate_gate(info)
        return super().act(observation, info)

    def _calibrate_gate(self, info: dict[str, Any]) -> None:
        """Step 7: record the interval that just ended against the applied candidate's predicted slacks, then set
        this decision's margin (`MissMargin`)."""
        last = self.decisions[-1] if self.decisions else None
        recent = self.ctx.probe.recent_arrivals(self.ctx.interval_s) if last is not None else None
        self.gate.observe(None if last is None else last["chosen"], info.get("new_misses"),
                          0 if recent is None else len(recent))

    def predicted_misses(self, config: tuple[int, int], w: WhatIf, track: bool) -> int:
        """Step 7: predicted slacks below the calibrated margin (>= 0; at 0 these are exactly the predicted misses);
        ePACT's count with ``miss_margin`` off."""
        if not self.miss_margin:
            return super().predicted_misses(config, w, track)
        return self.gate.count(config, w)

    def energy_scale(self, clock_mhz: int) -> float:
        return self.calibration.scale(clock_mhz) if self.calibrate else 1.0

    def interval_cost(self, commitment: float, hour_energy: float, target: float,
                      k: int) -> Callable[[float], float] | None:
        """Step 6: eq. 3 plus ``hour_end_weight`` times the hour's settlement of what the later intervals cannot
        recover (None, i.e. eq. 3, without a forecast or with the weight 0)."""
        if self.hour_end_weight == 0 or self._caps is None or self._floors is None:
            return None
        caps = (1.0 - self.cap_margin) * self._caps[1:]
        floors = self._floors[1:]
        if self.least_admitted_j is not None:  # the SLO gate's floor at the last decision, as far as the caps allow
            floors = np.maximum(floors, np.minimum(self.least_admitted_j, caps))
        return hour_end_cost(commitment, hour_energy, target, float(np.sum(caps)), float(np.sum(floors)),
                             self.ctx.lambda_plus, self.ctx.lambda_minus, self.hour_end_weight)

    def interval_forecast(self, info: dict[str, Any]) -> np.ndarray:
        """Forecast energy (J) of intervals k..K-1 of the current hour (flat: ones)."""
        ctx = self.ctx
        K = ctx.intervals_per_hour
        k = int(info["interval"])
        n = K - k
        flat = np.ones(n)
        cap_before = self._cap_now  # the uncalibrated cap of the interval that just ended
        self._caps = self._floors = self._cap_now = None
        if self.forecast_mode == "flat":
            return flat
        dt = ctx.interval_s
        now = float(info["t"])
        window = min(self.trend_window_s, math.floor(now / dt + 1e-9) * dt)
        if window < dt:
            return flat
        recent = ctx.probe.recent_arrivals(window)
        if recent is None or len(recent) == 0:
            return flat
        ages = now + window - np.asarray(recent.arrival_s, dtype=np.float64)  # replay shifts by the window
        trend = fit_trend(interval_counts(ages, window, dt), self.shrink, self.min_bins)
        snap = ctx.probe.snapshot()
        batch = max(1.0, snap.n_requests / max(int(info["active"]), 1))
        model = EnergyModel.of(self.laws, recent, dt, ctx.n_replicas, batch, self.util)
        if model is None:
            return flat
        lam = trend.forecast(n)
        energy = model.energy(lam)
        # the pool's most energy per interval, calibrated on the meter whenever the last interval ran all
        # replicas at the top clock (the profile knows neither the meter's nor the truth's deviations)
        laws = self.laws
        e_last = info.get("interval_energy_j")
        full_top = (e_last is not None and float(e_last) > 0 and int(info["active"]) == ctx.n_replicas
                    and int(info["clock_mhz"]) == laws.mhz[laws.top])
        if full_top:
            lam_last = float(np.count_nonzero(ages < dt))
            self.max_ratios.append(float(e_last) / float(model.max_energy(np.array([lam_last]))[0]))
        ratio = float(np.median(self.max_ratios)) if self.max_ratios else 1.0
        if full_top and self.calibrate and cap_before is not None:
            self.cap_meter.append((float(e_last), cap_before))
        raw_caps = capacity_caps(model, trend, n, ratio)
        self._cap_now = float(raw_caps[0])  # uncalibrated, as the calibration learns it
        scale = cap_scale(self.cap_meter)
        ratio *= scale
        self._caps = scale * raw_caps
        self._floors = np.minimum(ratio * model.min_energy(n), self._caps)
        self.forecasts.append({"t": now, "level": trend.level, "slope": trend.slope, "raw_slope": trend.raw_slope,
                               "se": trend.se, "first_j": float(energy[0]), "last_j": float(energy[-1]),
                               "cap_first_j": float(self._caps[0]), "max_ratio": ratio})
        return energy

    def nominal_allocation(self, commitment: float, info: dict[str, Any]) -> list[float]:
        K = self.ctx.intervals_per_hour
        k = int(info["interval"])
        f = self.interval_forecast(info)
        if self.tilt:
            j = np.arange(k, K)
            f = f * (1.0 + self.tilt * (2.0 * (j + 0.5) / K - 1.0))
        remaining = commitment - float(info["hour_energy_j"])
        if self.capacity_cap and self._caps is not None and remaining > 0:
            f = np.asarray(capped_targets(remaining, f.tolist(), self._caps.tolist()))
        b = forecast_allocation(commitment, K, k, f.tolist())
        check_allocation(commitment, b)
        return b
