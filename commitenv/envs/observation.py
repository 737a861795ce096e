"""The observation a learner sees: 16 features of the controller's view, their formulas, scales and bounds.

Observation (``Box`` float32, 16 features, ``OBS_FEATURES`` names them in order): a function of the controller's view
alone (``info``, `commitenv.control.ControllerContext` and its probe's ``snapshot()`` / ``recent_arrivals()``; test:
tests/envs/test_observation_view.py recomputes every feature from them), each scaled so that it stays in about [-1, 1] in
operation with its unit kept readable: fractions stay linear, energy ratios are compressed only far from their normal
range (``soft``: x up to 1, 1 + ln x beyond; ``slog``: sign(x) ln(1 + |x|), about x near 0), counts are log-scaled.
Nothing is cut off: the ``observation_space`` bounds hold every value a scenario can produce (the final guard clip
binds only at an energy ratio or a count beyond about 10^8). Learners: docs/training.md.

Symbols, each with where the view has it. K = intervals per hour, H = horizon hours (``ctx.intervals_per_hour``,
``ctx.horizon_hours``); k = interval of the hour and h = hour (``info["interval"]``, ``info["hour"]``: h = min(steps //
K, H - 1), k = steps - hK); N = GPUs (``ctx.n_replicas`` for one model, ``len(ctx.placement)`` on a shared pool), TDP
= ``ctx.profile.gpu.tdp_w``; E*_h = the hour's commitment, J (``info["commitment_j"]`` = ``ctx.commitments_j[h]``);
D_h = E*_h, or N x TDP x 3600 s when E*_h = 0 (energy-only); M = the controller meter's energy of the hour so far, J
(``info["hour_energy_j"]``; ``snapshot.meter_j`` minus its reading when the hour began) and e = the last interval's,
J (``info["interval_energy_j"]``; the change of ``snapshot.meter_j``; 0 at the reset); A = requests arrived so far,
rejected ones included (``len(recent_arrivals(w))`` for a window w reaching back past t = 0); live requests = the
arrived, unfinished requests of ``snapshot.requests`` (running batches, queues, unrouted, migrating), with visible
deadlines ``deadline_s`` and now = ``snapshot.t``.

====  =======================  ===========================================  ==========  ===================
idx   name                     formula (unit, scale)                        bounds      typical (bench hour)
====  =======================  ===========================================  ==========  ===================
0     time_in_hour             k / K (K in the final observation)           [0, 1]      0 .. 1
1     hour_of_horizon          h / H (constant 0 in single-hour scenarios)  [0, 1]      0
2     commitment               soft(E*_h / (N x TDP x 3600 s)): the         [0, 20]     0.16
                               commitment against the pool's full power
3     hour_energy              soft(M / D_h): 1 = the commitment is used    [0, 20]     0 .. 1.1
                               up
4     last_interval_energy     slog(e / (D_h / K) - 1): 0 = at the nominal  [-20, 20]   -0.7 .. 0.35
                               share, -ln 2 = nothing
5     target                   slog(T / (D_h / K) - 1), T = (D_h - M) /     [-20, 20]   -2.3 .. 2.8
                               (K - k) the remaining commitment split
                               evenly (T = 0 at k = K): 0 = on track,
                               > 0 behind, < 0 ahead
6     arrivals                 log1p(A - A at the last boundary) / 10       [0, 2]      0 .. 0.7
7     waiting                  log1p(live requests not in a running         [0, 2]      0 .. 0.6
                               batch: queued, unrouted, migrating) / 10
8     running                  log1p(live requests in running batches)/10   [0, 2]      0 .. 0.5
9     waiting_tokens           log1p(sum over live requests of max(0,       [0, 2]      0 .. 0.9
                               prompt + generated - computed - [generated
                               > 0])) / 15: tokens to compute before each
                               next output token (the prompt still to
                               prefill; after a recompute preemption the
                               generated tokens too)
10    slack_min                tanh(min over live requests of (visible      [-1, 1]     -1 .. 1
                               deadline - now) / 60 s); 1 with none live
11    slack_mean               tanh(mean of the same slacks / 60 s); 1      [-1, 1]     -0.6 .. 1
                               with none live
12    overdue_frac             live requests with visible deadline < now /  [0, 1]      0 .. 1
                               live requests; 0 with none live
13    active                   ``info["active"]`` / ``ctx.n_replicas``:     [0, 1]      0.03 .. 1
                               configured active replicas (summed over
                               models on a shared pool) / replicas
14    clock                    index of ``info["clock_mhz"]`` in            [0, 1]      0 .. 1
                               ``ctx.clocks_mhz`` / max(levels - 1, 1)
                               (the highest GPU's on a shared pool)
15    misses                   log1p(``info["misses"]``) / 10: deadline     [0, 2]      0 .. 1
                               misses known so far (the sum of
                               ``info["cost"]``)
====  =======================  ===========================================  ==========  ===================

The reset's observation has e = 0 (feature 4 = -ln 2); the final one (after the last step and the drain) has k = K and
M = 0 (the hour has closed), so feature 5 is slog(-1) = -ln 2, and no live requests. Energy-only hours (``commitment:
{energy_only: true}``, E*_h = 0): feature 2 is 0 (soft(0)), which tells a policy it is in the energy-only regime, and
features 3, 4 and 5 use D_h = N x TDP x 1 h, so nothing divides by E*_h = 0. ``info["commitment_j"]`` is then 0 and
``info["target_j"]`` keeps its formula (E*_h - M)/(K - k), i.e. -M/(K - k).

``hour_of_horizon`` and ``commitment`` are constant in a single-hour scenario; they are kept so that the observation is
the same vector in every scenario (a policy can be carried to multi-hour days and other commitment levels), and a
learner's running normalization turns a constant feature into a constant 0. The typical ranges are those of vLLM,
random and under-provisioned policies on ``bench-h200-hour-fixed-a30``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from commitenv.settlement import remaining_per_interval

OBS_FEATURES = (
    "time_in_hour",
    "hour_of_horizon",
    "commitment",
    "hour_energy",
    "last_interval_energy",
    "target",
    "arrivals",
    "waiting",
    "running",
    "waiting_tokens",
    "slack_min",
    "slack_mean",
    "overdue_frac",
    "active",
    "clock",
    "misses",
)
_R = 20.0  # bound of the compressed energy ratios: soft and slog reach it only at a ratio of ~10^8
OBS_LOW = np.array([0, 0, 0, 0, -_R, -_R, 0, 0, 0, 0, -1, -1, 0, 0, 0, 0], dtype=np.float32)
OBS_HIGH = np.array([1, 1, _R, _R, _R, _R, 2, 2, 2, 2, 1, 1, 1, 1, 1, 2], dtype=np.float32)


def soft(x: float) -> float:
    """A non-negative ratio whose unit is 1: itself up to 1, then 1 + ln x (continuous with slope 1 at 1), so
    that an unusual ratio (a commitment far above the pool's draw) stays finite without being cut off."""
    return x if x <= 1.0 else 1.0 + math.log(x)


def slog(x: float) -> float:
    """Signed log, sign(x) ln(1 + |x|): about x near 0, logarithmic far from it (a deviation from a nominal share)."""
    return math.copysign(math.log1p(abs(x)), x)


def energy_features(commit_j: float, used_j: float, last_j: float, k: int, K: int, e_scale: float) -> list[float]:
    """Features 2-5 (commitment, hour_energy, last_interval_energy, target) of an hour with commitment ``commit_j``,
    ``used_j`` of it used after ``k`` of its ``K`` intervals, ``last_j`` in the last one; ``e_scale`` = N x TDP x 1 h
    (see the table above). Also what a site coordinator's budget makes of them (`commitenv.site.pools`)."""
    d = commit_j if commit_j > 0 else e_scale  # D_h: an energy-only hour (E*_h = 0) takes the full-power hour's energy
    target = remaining_per_interval(d, used_j, k, K)
    return [soft(max(commit_j, 0.0) / e_scale), soft(max(used_j, 0.0) / d), slog(last_j / (d / K) - 1.0),
            slog(target / (d / K) - 1.0)]


def observe(env: Any) -> np.ndarray:
    """The 16 features of a `CommitServeEnv`'s current decision boundary (the table above); advances its arrival
    counter."""
    pool = env.pool
    k, K = env.k, env.K
    h = min(k // K, env.H - 1)
    kin = k - h * K
    m = env.meter_prev - env.meter_hour_start  # the controller's meter, not the settled energy
    now = pool.now
    slots, left = pool.live_state()
    n_live = len(slots)
    wait_tokens = overdue = 0
    slack = np.empty(0)
    if n_live:  # reduced in numpy: the queue can hold 10^5 requests
        wait_tokens = int(np.maximum(left, 0).sum())
        slack = pool.visible_deadline[slots] - now  # (the true deadlines where the scenario shows them)
        overdue = int(np.count_nonzero(slack < 0))
    cnt = pool.counts()
    arrivals = pool.arrived - env.arrived_prev
    env.arrived_prev = pool.arrived
    x = np.array(
        [
            kin / K,
            h / env.H,
            *energy_features(float(env.commit_j[h]), m, env.last_interval_j, kin, K, env._e_scale),
            math.log1p(arrivals) / 10,
            math.log1p(cnt["waiting"]) / 10,
            math.log1p(cnt["running"]) / 10,
            math.log1p(wait_tokens) / 15,
            math.tanh(float(slack.min()) / 60) if n_live else 1.0,
            math.tanh(float(slack.mean()) / 60) if n_live else 1.0,
            overdue / n_live if n_live else 0.0,
            env.cfg[0] / env.n_replicas,
            env.cfg[1] / max(len(env.clocks_mhz) - 1, 1),
            math.log1p(env.misses) / 10,
        ],
        dtype=np.float32,
    )
    return np.clip(x, OBS_LOW, OBS_HIGH)  # a guard only: see the module docstring for when it can bind
