"""The observation is a function of the controller's view (issue 33, item 8): every one of the 16 features of
`commitenv.envs.OBS_FEATURES` is recomputed here, at every step of `paper` episodes, from what a controller may
legally see — the step's ``info``, the `ControllerContext` and ``ctx.probe`` (``snapshot()``,
``recent_arrivals()``) — with the formulas of the module docstring of `commitenv.envs.commit_serve`, and must equal
the env's vector. Nothing here reads ``env.pool``, ``env.table`` or other engine state, except the sensitivity
check, which reads the truth on purpose to show that a truth-fed feature would be caught.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from commitenv.control import ControllerContext, Snapshot
from commitenv.envs import OBS_FEATURES, CommitServeEnv
from helpers.scenarios import write_scenario, write_trace

BENCH = "bench-h200-hour-fixed-a30"  # realism paper, 32 H200, 60 one-minute intervals (the compiled engine)
BENCH_SEED = 100_000  # in bench's declared test range
SHARED = "festina-h100-shared-energy"  # realism paper, three models sharing 8 H100, energy-only, no reference run
SHARED_SEED = 100_000
ATOL = 2e-6  # float32 rounding of values in [-20, 20]: both sides round the same float64 numbers


# ------------------------------------------------------------------------------------------ the recomputation
def _soft(x: float) -> float:
    """soft(x): x up to 1, then 1 + ln x (documented compression of a non-negative energy ratio)."""
    return x if x <= 1.0 else 1.0 + math.log(x)


def _slog(x: float) -> float:
    """slog(x) = sign(x) ln(1 + |x|) (documented compression of a deviation from a nominal share)."""
    return math.copysign(math.log1p(abs(x)), x)


@dataclass
class ViewObserver:
    """Rebuilds the observation from the controller's view alone, keeping the little state a controller would
    keep between steps (its step count, the arrivals count and meter reading at the last boundaries)."""

    ctx: ControllerContext
    steps: int = 0
    arrived_before: int = 0
    meter_hour_start_j: float = 0.0
    meter_before_j: float = 0.0

    @property
    def n_gpus(self) -> int:
        """N, the pool's GPUs: one replica per GPU for one model, ``placement`` lists them on a shared pool."""
        return len(self.ctx.placement) if self.ctx.shared else self.ctx.n_replicas

    def arrived(self, snap: Snapshot) -> int:
        """Requests arrived so far: a ``recent_arrivals`` window reaching back past t = 0 holds all of them."""
        return len(self.ctx.probe.recent_arrivals(snap.t + self.ctx.interval_s))

    def observe(self, info: dict[str, Any]) -> np.ndarray:
        """The 16 features after a reset (``steps == 0``) or a step, with cross-checks of the view's own
        redundancies (info against the snapshot's meter, the context's commitments and its own counters)."""
        ctx = self.ctx
        K, H = ctx.intervals_per_hour, ctx.horizon_hours
        snap = ctx.probe.snapshot()
        # hour and interval: the controller's own count of steps, which info reports too
        h = min(self.steps // K, H - 1)
        kin = self.steps - h * K
        assert (info["hour"], info["interval"]) == (h, kin)
        # energies: the controller meter's readings at the boundaries (the snapshot's meter_j), as info reports them
        meter = float(snap.meter_j)
        if self.steps > 0 and self.steps % K == 0:  # an hour closed at this boundary
            self.meter_hour_start_j = meter
        m = meter - self.meter_hour_start_j
        last = meter - self.meter_before_j
        self.meter_before_j = meter
        assert m == pytest.approx(info["hour_energy_j"], rel=1e-12, abs=1e-6)
        assert last == pytest.approx(info["interval_energy_j"], rel=1e-12, abs=1e-6)
        ec = ctx.commitments_j[h]
        assert ec == info["commitment_j"]
        d_full = self.n_gpus * ctx.profile.gpu.tdp_w * 3600.0  # N x TDP x 1 h
        d = ec if ec > 0 else d_full  # D_h: an energy-only hour takes the pool's full-power hour
        target = (d - m) / (K - kin) if kin < K else 0.0
        if kin < K:
            assert info["target_j"] == pytest.approx((ec - m) / (K - kin), rel=1e-9, abs=1e-6)
        # arrivals: the change of the arrived count since the last boundary
        arrived = self.arrived(snap)
        arrivals = arrived - self.arrived_before
        self.arrived_before = arrived
        # live requests: the snapshot's running batches, queues, unrouted and migrating requests
        req = snap.requests
        n = len(req)
        running = int(np.count_nonzero(req.running))
        waiting = n - running
        assert running == int(snap.replicas.running.sum())
        left = req.prompt_tokens + req.generated_tokens - req.computed_tokens - (req.generated_tokens > 0)
        waiting_tokens = int(np.maximum(left, 0).sum())
        slack = req.deadline_s - snap.t  # visible deadlines
        # configuration and misses: info
        clock_idx = ctx.clocks_mhz.index(info["clock_mhz"])
        x = np.array([
            kin / K,
            h / H,
            _soft(ec / d_full),
            _soft(m / d),
            _slog(last / (d / K) - 1.0),
            _slog(target / (d / K) - 1.0),
            math.log1p(arrivals) / 10,
            math.log1p(waiting) / 10,
            math.log1p(running) / 10,
            math.log1p(waiting_tokens) / 15,
            math.tanh(float(slack.min()) / 60) if n else 1.0,
            math.tanh(float(slack.mean()) / 60) if n else 1.0,
            np.count_nonzero(slack < 0) / n if n else 0.0,
            info["active"] / ctx.n_replicas,
            clock_idx / max(len(ctx.clocks_mhz) - 1, 1),
            math.log1p(info["misses"]) / 10,
        ], dtype=np.float32)
        self.steps += 1
        return x


def _policy(rng: np.random.Generator, ctx: ControllerContext, k: int) -> dict[str, Any]:
    """Full pool at the top clock for two steps, then random configurations biased to few replicas, so that
    backlogs, overdue requests and misses build and drain (a shared pool: per-model counts, per-GPU clocks)."""
    clocks = ctx.clocks_mhz
    if k < 2:
        return ctx.action(ctx.all_active, clocks[-1])
    if ctx.shared:
        per_gpu = [clocks[int(rng.integers(0, len(clocks)))] for _ in ctx.placement]
        return ctx.action(tuple(int(rng.integers(1, n + 1)) for n in ctx.replicas_per_model), per_gpu[0],
                          clocks_mhz=per_gpu)
    n = ctx.n_replicas
    active = int(rng.integers(1, max(2, n // 4) + 1)) if rng.random() < 0.7 else int(rng.integers(1, n + 1))
    return ctx.action(active, clocks[int(rng.integers(0, len(clocks)))])


@dataclass
class EpisodeRecord:
    """What the comparison saw over an episode: the env's observations and a few facts showing it was not vacuous."""

    env_obs: np.ndarray  # one row per observation, the reset's first
    max_live: int
    recomputing: int  # live requests seen at boundaries with generated tokens to recompute (preempted)
    max_overdue: float
    misses: int
    hours_closed: int


def _check_ends(first: np.ndarray, last: np.ndarray) -> None:
    """The documented ends: the reset has no last interval (e = 0: -ln 2); the final observation, after the drain,
    has k = K, a closed hour (M = 0, T = 0: -ln 2) and no live requests."""
    f = {name: i for i, name in enumerate(OBS_FEATURES)}
    ln2 = np.float32(-math.log(2.0))
    assert first[f["last_interval_energy"]] == pytest.approx(ln2, abs=ATOL)
    assert last[f["time_in_hour"]] == 1.0 and last[f["hour_energy"]] == 0.0
    assert last[f["target"]] == pytest.approx(ln2, abs=ATOL)
    assert (last[f["waiting"]], last[f["running"]], last[f["waiting_tokens"]]) == (0.0, 0.0, 0.0)
    assert (last[f["slack_min"]], last[f["slack_mean"]], last[f["overdue_frac"]]) == (1.0, 1.0, 0.0)


def _compare_episode(env: CommitServeEnv, seed: int) -> EpisodeRecord:
    """Run one episode; at the reset and after every step recompute the observation from the view and assert
    it equals the env's (feature by feature, naming the first that differs)."""
    obs, info = env.reset(seed=seed)
    ctx = ControllerContext.from_env(env)
    view = ViewObserver(ctx)
    rng = np.random.default_rng(seed)
    assert np.array_equal(obs, view.observe(info)), "the reset's observation differs from the view's"
    got, live, hours, recomputing = [obs], [], 0, 0
    terminated, k, known = False, 0, 0.0
    while not terminated:
        action = _policy(rng, ctx, k)
        obs, _, terminated, _, info = env.step(action)
        hours += "settlement" in info
        known += info["cost"]
        assert info["misses"] == known, "misses: the sum of the constraint signal info['cost']"
        k += 1
        x = view.observe(info)
        req = ctx.probe.snapshot().requests
        live.append(len(req))
        recomputing += int(np.count_nonzero((req.generated_tokens > 0)
                                            & (req.computed_tokens < req.prompt_tokens + req.generated_tokens - 1)))
        got.append(obs)
        bad = np.flatnonzero(~np.isclose(obs, x, rtol=0.0, atol=ATOL))
        assert not len(bad), (f"step {k}: features differ from the view's: "
                              + ", ".join(f"{OBS_FEATURES[i]} env {obs[i]!r} view {x[i]!r}" for i in bad))
    env_obs = np.array(got)
    assert np.all(env_obs >= env.observation_space.low) and np.all(env_obs <= env.observation_space.high)
    _check_ends(env_obs[0], env_obs[-1])
    overdue = float(env_obs[:, OBS_FEATURES.index("overdue_frac")].max())
    return EpisodeRecord(env_obs, max(live), recomputing, overdue, int(info["misses"]), hours)


# ------------------------------------------------------------------------------------------ scenarios
def _toy_trace(path: Path) -> Path:
    """Two hours of small requests: a steady trickle plus bursts of 40 two seconds before three interval
    boundaries (so snapshots hold queued, running, overdue and preempted requests: the toy KV cache holds 64
    tokens), and two prompts over the toy context limit (64; rejected: arrived and missed, never live)."""
    rng = np.random.default_rng(11)
    t = np.concatenate([[0.0], rng.uniform(1.0, 7190.0, 150), np.full(40, 898.0), np.full(40, 3598.0),
                        np.full(40, 4798.0), [2000.0, 6000.0]])
    p = np.concatenate([rng.integers(4, 30, len(t) - 2), [80, 90]])
    o = rng.integers(2, 30, len(t))
    order = np.argsort(t, kind="stable")
    return write_trace(path, t[order], p[order], o[order])


@pytest.fixture(scope="module")
def toy_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the toy trace, shared by the module's toy scenarios."""
    folder = tmp_path_factory.mktemp("obsview")
    _toy_trace(folder / "obs.csv")
    return folder


def _toy_env(folder: Path, commitment: dict) -> CommitServeEnv:
    """The 2-GPU toy pool at realism paper (controller meter apart from the settlement meter, predicted lengths
    and deadlines, truth noise), two hours of twelve 300 s intervals, tight SLOs (alpha 2)."""
    name = "obs-view-" + ("energy-only" if commitment.get("energy_only") else "committed")
    path = write_scenario(folder, name, workload={"trace": str(folder / "obs.csv")}, horizon_hours=2, interval_s=300,
                          alpha=2.0, epsilon=0.2, commitment=commitment, lambda_plus=3.0, lambda_minus=0.5,
                          realism="paper")
    return CommitServeEnv(str(path))


# ------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("commitment", [{"mj": [0.15, 0.4]}, {"energy_only": True}], ids=["committed", "energy-only"])
def test_toy_observation_is_recomputed_from_the_view(toy_folder: Path, commitment: dict) -> None:
    """Two-hour toy episodes (an hour rollover, rejected prompts, backlogs): every feature at every step equals
    the view's recomputation, with commitments and in the energy-only regime (D_h = N x TDP x 1 h)."""
    env = _toy_env(toy_folder, commitment)
    assert env.realism.level == "paper"
    rec = _compare_episode(env, seed=3)
    assert rec.hours_closed == 2
    assert rec.max_live > 10 and rec.max_overdue > 0 and rec.misses > 0, "the episode should exercise the queue"
    assert rec.recomputing > 0, "a preempted request's recompute should count in waiting_tokens"
    col = {f: rec.env_obs[:, i] for i, f in enumerate(OBS_FEATURES)}
    assert np.ptp(col["hour_of_horizon"]) > 0 and np.ptp(col["waiting"]) > 0 and np.ptp(col["slack_min"]) > 0
    if commitment.get("energy_only"):
        assert np.all(col["commitment"] == 0.0)


def test_bench_observation_is_recomputed_from_the_view() -> None:
    """The benchmark hour at `paper` (the compiled engine, 32 replicas, thousands of live requests): every feature
    at every one of the 60 steps equals the view's recomputation."""
    env = CommitServeEnv(BENCH)
    assert env.realism.level == "paper"
    rec = _compare_episode(env, seed=BENCH_SEED)
    assert len(rec.env_obs) == 61 and rec.hours_closed == 1
    assert rec.max_live > 100 and rec.max_overdue > 0 and rec.misses > 0


def test_shared_pool_observation_is_recomputed_from_the_view() -> None:
    """A shared pool at `paper` (three models on 8 GPUs, energy-only, per-GPU clocks): N is the GPUs of
    ``ctx.placement``, ``active`` the instances summed over models and ``clock`` the highest GPU clock, as info
    reports them."""
    env = CommitServeEnv(SHARED)
    assert env.realism.level == "paper" and env.shared
    rec = _compare_episode(env, seed=SHARED_SEED)
    col = {f: rec.env_obs[:, i] for i, f in enumerate(OBS_FEATURES)}
    assert rec.max_live > 10 and np.ptp(col["active"]) > 0 and np.ptp(col["clock"]) > 0
    assert np.all(col["commitment"] == 0.0)


def test_the_comparison_would_see_truth_in_the_observation(toy_folder: Path) -> None:
    """Sensitivity: at `paper` the truth differs from the view where the observation could leak it — true against
    visible deadlines (features 10 to 12) and the settlement meter against the controller's (3 and 4) — by far
    more than the tolerance, so a feature computed from the truth would fail the comparison above."""
    env = _toy_env(toy_folder, {"mj": [0.15, 0.4]})
    obs, info = env.reset(seed=3)
    ctx = ControllerContext.from_env(env)
    rng = np.random.default_rng(3)
    slack_gap = meter_gap = hour_j = 0.0
    for k in range(env.K * env.H):
        obs, _, terminated, _, info = env.step(_policy(rng, ctx, k))
        snap = ctx.probe.snapshot()
        if snap.n_requests:
            true_slack = env.pool.deadline[snap.requests.slot] - snap.t  # the truth, read on purpose
            slack_gap = max(slack_gap, abs(math.tanh(float(true_slack.mean()) / 60) - float(obs[11])))
        hour_j += info["interval_energy_j"]  # the controller meter's energy of the hour
        if "settlement" in info:
            settled = info["settlement"]  # the settlement meter, read once the hour closes
            meter_gap = max(meter_gap, abs(settled["energy_j"] - hour_j) / settled["commitment_j"])
            hour_j = 0.0
    assert slack_gap > 100 * ATOL, "true and visible deadlines should differ at paper"
    assert meter_gap > 100 * ATOL, "the settlement and controller meters should differ at paper"
