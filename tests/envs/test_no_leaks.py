"""Attacks on causality: every way a controller could reach the ground truth, each asserted to fail.

A controller gets observations, ``info``, a `ControllerContext` and ``ctx.probe`` (``snapshot()``,
``recent_arrivals()``). At realism ``paper`` (the ``bench-*`` benchmark) none of these may carry what only the
truth knows: true output lengths (hence true deadlines), the per-GPU / per-cell noise factors, the settlement
meter between settlements, the run seed (which regenerates the trace with its true lengths). At ``ideal``
(``epact-*``, exact reproduction) true deadlines are visible by design; tests below document that too.

Each attack is checked for sensitivity where possible: the same measurement applied to the *old* behaviour
(e.g. the snapshot sharing ``pool.opt`` with the truth, simulated by mutating the truth's own options) must
detect the difference, so a test cannot pass vacuously.
"""

from __future__ import annotations

import dataclasses
import enum
import gc
import types

import numpy as np
import pytest
from pydantic import BaseModel

from commitenv.envs import CommitServeEnv
from commitenv.evaluation import run_episode, score_episode
from commitenv.scenarios import load_scenario, scenario_workload
from commitenv.scenarios.build import derived_seed
from commitenv.sim import coeffs as _coeffs
from commitenv.sim.kernel.layout import G_CLOCK, GF_FLOOR_W, GF_POWER, R_FE, R_FLOOR_W, R_FT, R_GPU, R_SEG
from commitenv.sim.lref import reference_latency
from commitenv_controllers import Controller

PAPER = "bench-h200-hour-fixed-a30"  # realism paper: predicted deadlines, truth factors, new trace per seed
IDEAL = "epact-h200-hour-fixed-a30"  # realism ideal: exact reproduction, true deadlines visible
SEED = 100_042  # in bench's declared test range [100000, 100100)


# ================================================================================================ fixtures
@pytest.fixture(scope="module")
def paper_env() -> CommitServeEnv:
    return CommitServeEnv(PAPER)  # the commitment's reference run happens once per module


@pytest.fixture(scope="module")
def ideal_env() -> CommitServeEnv:
    return CommitServeEnv(IDEAL)


def _act(env: CommitServeEnv, k: int) -> dict[str, int]:
    """Full pool at the reference clock for two minutes, then 6 replicas at the lowest clock: a backlog builds,
    so snapshots hold many live requests (queued and running) and most GPUs idle or in standby."""
    if k < 2:
        return {"active": env.n_replicas, "clock": env.profile.reference_clock_index}
    return {"active": 6, "clock": 0}


def _busy(env: CommitServeEnv, seed: int = SEED, steps: int = 5):
    obs, info = env.reset(seed=seed)
    for k in range(steps):
        obs, _, _, _, info = env.step(_act(env, k))
    return obs, info


# ================================================================================================ object graphs
_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType,
         types.FrameType)
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, tuple, frozenset, range, np.generic, np.dtype,
              enum.Enum)


def _walk(*roots) -> tuple[dict[int, object], dict[int, int]]:
    """Every object reachable from ``roots`` through references (classes, modules and functions not entered:
    they lead to the whole interpreter), with one parent per object for error messages."""
    seen: dict[int, object] = {}
    parent: dict[int, int] = {}
    stack = list(roots)
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, _SKIP):
            continue
        seen[id(o)] = o
        for c in gc.get_referents(o):
            if id(c) not in seen and not isinstance(c, _SKIP):
                parent.setdefault(id(c), id(o))
                stack.append(c)
    return seen, parent


def _frozen(o: object) -> bool:
    if isinstance(o, BaseModel):
        return bool(o.model_config.get("frozen"))
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return bool(o.__dataclass_params__.frozen)
    return False


def _path(seen: dict[int, object], parent: dict[int, int], i: int) -> str:
    """``Snapshot.pool.replicas[0].profile.clocks``-style route from the root to object ``i``."""
    chain = [i]
    while chain[-1] in parent and len(chain) < 30:
        chain.append(parent[chain[-1]])
    objs = [seen[j] for j in reversed(chain)]
    out = type(objs[0]).__name__
    for a, b in zip(objs, objs[1:]):
        if getattr(a, "__dict__", None) is b:
            continue  # an instance's attribute dict: rendered as .name at the next step
        if isinstance(a, dict):
            key = next((k for k, v in a.items() if v is b), "?")
            owner = any(getattr(o, "__dict__", None) is a for o in objs)
            out += f".{key}" if owner and isinstance(key, str) else f"[{key!r}]"
        elif isinstance(a, (list, tuple)):
            out += f"[{next((n for n, v in enumerate(a) if v is b), '?')}]"
        else:
            names = [*getattr(type(a), "__slots__", ()), *getattr(a, "__dict__", {})]
            name = next((n for n in names if getattr(a, n, None) is b), None)
            out += f".{name}" if name else f" -> {type(b).__name__}"
    return out


def _shared_mutables(controller_side: tuple, truth_side: tuple) -> list[str]:
    """Objects reachable from both sides that can be changed through their normal API (lists, dicts, sets,
    arrays, non-frozen instances). Immutable atoms, tuples and frozen models (with their own ``__dict__``) are
    fine to share."""
    S, par = _walk(*controller_side)
    T, _ = _walk(*truth_side)
    internal: set[int] = set()
    for o in S.values():
        if _frozen(o):
            for name in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"):
                v = getattr(o, name, None)
                if v is not None:
                    internal.add(id(v))
    bad = []
    for i in S.keys() & T.keys():
        o = S[i]
        if isinstance(o, _IMMUTABLE) or _frozen(o) or i in internal:
            continue
        bad.append(f"{_path(S, par, i)}: {type(o).__name__} {repr(o)[:60]}...")
    return sorted(bad)


# ================================================================================================ 1. shared objects
def test_snapshot_options_lists_and_engine_objects_are_copies(paper_env):
    env = paper_env
    _busy(env)
    pool = env.pool
    snap = env.unwrapped.snapshot()
    assert snap._engine.opt is not pool.opt
    assert snap._engine.profiles is not pool.profiles
    assert snap._engine._ks is not pool._ks
    assert len(snap.requests) > 50, "expected a backlog"
    truth_arrays = _arrays(pool._ks)
    mine = _arrays(snap._engine._ks)
    assert len(mine) > 20 and len(truth_arrays) > 20
    shared = [(a, b) for a, x in mine.items() for b, y in truth_arrays.items() if np.shares_memory(x, y)]
    assert not shared, f"snapshot state arrays sharing memory with the truth's: {shared}"


def _arrays(ks) -> dict[str, np.ndarray]:
    """Every array a kernel state holds (its attributes, those inside tuples such as the prefix cache's, and those of
    the objects it holds such as its workload rows), by name."""
    out = {}
    for name, v in vars(ks).items():
        parts = v if isinstance(v, tuple) else (v,)
        if hasattr(v, "__dict__") and not isinstance(v, np.ndarray):
            parts = tuple(vars(v).values())
        for k, x in enumerate(parts):
            if isinstance(x, np.ndarray) and x.size:
                out[f"{name}[{k}]" if len(parts) > 1 or parts is not (v,) else name] = x
    return out


def _option_attack_run(env: CommitServeEnv, attack: str) -> dict:
    """8 steps; before step 2 ``attack`` mutates the options of the snapshot ('snapshot') or, simulating the
    old shared ``pool.opt``, of the truth itself ('truth'). Records what later snapshots show and the truth."""
    env.reset(seed=SEED)
    seen = []
    for k in range(8):
        if k == 2 and attack != "none":
            snap = env.unwrapped.snapshot()
            opt = snap._engine.opt if attack == "snapshot" else env.pool.opt
            opt.oracle_lengths = True
            opt.closed_form = False
            opt.length_error_sigma = 0.0
            opt.visible_deadlines = "true"
        env.step(_act(env, k))
        if k >= 3:
            s = env.unwrapped.snapshot()
            rq = s.requests
            seen.append(sorted(zip(rq.slot.tolist(), rq.output_tokens.tolist(), rq.deadline_s.tolist())))
    pool = env.pool
    return {
        "snapshots": seen,
        "energy": pool.energy_j(),
        "gpu_energy": pool.gpu_energy_j().tolist(),
        "finish": np.nan_to_num(pool.finish_t, nan=-1.0).tolist(),
    }


@pytest.mark.parametrize("level", ["paper", "ideal"])
def test_mutating_snapshot_options_changes_neither_later_snapshots_nor_truth(level, paper_env, ideal_env):
    env = paper_env if level == "paper" else ideal_env
    clean = _option_attack_run(env, "none")
    attacked = _option_attack_run(env, "snapshot")
    assert attacked["snapshots"] == clean["snapshots"], "later snapshots changed (e.g. true lengths appeared)"
    assert attacked["energy"] == clean["energy"] and attacked["gpu_energy"] == clean["gpu_energy"]
    assert attacked["finish"] == clean["finish"]
    # sensitivity: had the snapshot shared the truth's options (the old behaviour), the same attack shows
    old = _option_attack_run(env, "truth")
    assert old["snapshots"] != clean["snapshots"], "the measurement cannot see an options leak"
    if level == "ideal":  # the legacy per-segment noise draws differ with closed_form off: the truth itself moves
        assert old["energy"] != clean["energy"]


def test_snapshot_shares_no_mutable_object_with_truth(paper_env):
    """Object-graph check: nothing reachable from what a controller gets (snapshot, recent arrivals) that can be
    changed in place may be reachable from the environment too (a write-through to the truth)."""
    env = paper_env
    _busy(env)
    snap = env.unwrapped.snapshot()
    recent = env.unwrapped.recent_arrivals(120.0)
    bad = _shared_mutables((snap, recent), (env.unwrapped,))
    assert not bad, "mutable objects shared between the snapshot and the truth:\n" + "\n".join(bad)


def test_mutating_the_snapshot_profile_does_not_change_the_truth(paper_env):
    """Write-through attack on the profile a snapshot carries: zero the idle powers in its clock table, then let
    the truth change its clock (which re-reads the idle floor). The truth's energy must not move.

    Profiles are cached process-wide (`load_profile`), so a successful attack would also poison every later
    episode in the process: the original table is restored whatever happens."""
    env = paper_env

    def run(attack: bool) -> float:
        env.reset(seed=SEED)
        for k in range(4):
            if k == 2 and attack:
                prof = env.unwrapped.snapshot()._engine.profiles[0]
                try:
                    prof.clocks[:] = [c.model_copy(update={"active_idle_w": 1.0, "draining_idle_w": 1.0})
                                      for c in prof.clocks]
                except (TypeError, AttributeError, ValueError):
                    pass  # an immutable table: the attack fails outright
                try:
                    prof.sources["attack"] = "written by a controller"
                except (TypeError, AttributeError, ValueError):
                    pass
            env.step({"active": env.n_replicas, "clock": env.profile.reference_clock_index if k < 3 else 0})
        return env.pool.energy_j()

    truth_prof = env.pool.profiles[0]
    saved_clocks = list(truth_prof.clocks)
    saved_sources = dict(truth_prof.sources)
    try:
        clean = run(False)
        attacked = run(True)
        idle_after = [c.active_idle_w for c in env.pool.profiles[0].clocks]
        src_after = dict(env.pool.profiles[0].sources)
    finally:
        if isinstance(truth_prof.clocks, list) and any(a is not b for a, b in zip(truth_prof.clocks, saved_clocks)):
            truth_prof.clocks[:] = saved_clocks
            for key in [k for k in _coeffs._CACHE if k[0] == id(truth_prof)]:  # coefficients built meanwhile
                del _coeffs._CACHE[key]
        if isinstance(truth_prof.sources, dict) and truth_prof.sources != saved_sources:
            truth_prof.sources.clear()
            truth_prof.sources.update(saved_sources)
    problems = []
    if attacked != clean:
        problems.append(f"the truth's energy moved from {clean / 1e6:.4f} MJ to {attacked / 1e6:.4f} MJ")
    if idle_after != [c.active_idle_w for c in saved_clocks]:
        problems.append(f"the truth's clock table was rewritten (active idle W now {idle_after})")
    if src_after != saved_sources:
        problems.append("the truth's profile.sources was written")
    assert not problems, "write-through from the snapshot's profile: " + "; ".join(problems)


# ================================================================================================ 2. noise factors
def _snap_and_factor(env: CommitServeEnv):
    _busy(env)
    snap = env.unwrapped.snapshot()
    bias = env.realism.energy_model.bias
    assert bias > 0, "paper realism is expected to have an energy-model bias"
    return snap, 1.0 / (1.0 + bias)


def test_snapshot_gpus_have_the_nominal_power_factor_only(paper_env):
    env = paper_env
    snap, ef = _snap_and_factor(env)
    truth_pf = env.pool._ks.gf[:, GF_POWER]
    assert np.ptp(truth_pf) > 0, "the truth should have per-GPU power factors"
    ks = snap._engine._ks
    for g in range(ks.G):
        assert ks.gf[g, GF_POWER] == pytest.approx(ef, rel=1e-12)
        assert not np.any(np.isclose(ks.gf[g, GF_POWER], truth_pf, rtol=1e-9, atol=0.0))
        # the idle floors: the nominal ones x ef, and the GPU's floor now one of them
        np.testing.assert_allclose(ks.floor_tab[g, :, :3], ks.floor_tab[g, :, 3:] * ef, rtol=1e-12)
        assert ks.gf[g, GF_FLOOR_W] in ks.floor_tab[g, ks.gi[g, G_CLOCK], :3].tolist()


def test_snapshot_segments_in_flight_are_nominal(paper_env):
    env = paper_env
    snap, ef = _snap_and_factor(env)
    mine, truth = snap._engine._ks, env.pool._ks
    busy = [x for x in range(mine.R) if mine.ri[x, R_SEG]]
    assert busy, "expected segments in flight"
    assert any(truth.rf[x, R_FT] != 1.0 for x in busy), "the truth's segments carry factors (else the check is vacuous)"
    for x in busy:
        assert mine.rf[x, R_FT] == 1.0
        assert mine.rf[x, R_FE] == pytest.approx(ef, rel=1e-12)


def test_snapshot_idle_replicas_carry_no_truth_factors(paper_env):
    """Every replica of a snapshot, not only those with a step in flight: an idle one must not show the truth's
    factors of its last step (time factor with stragglers, energy factor with the per-GPU power factor) nor
    the floor power that step was charged against (= nominal idle power x the GPU's power factor)."""
    env = paper_env
    snap, ef = _snap_and_factor(env)
    prof = env.profile
    nominal_floors = sorted({w for c in prof.clocks for w in (c.active_idle_w, c.draining_idle_w)} | {prof.standby_w})
    mine, truth = snap._engine._ks, env.pool._ks
    truth_pf = truth.gf[:, GF_POWER]
    idle = [x for x in range(mine.R) if not mine.ri[x, R_SEG]]
    assert idle, "expected idle replicas"
    assert any(truth.rf[x, R_FT] != 1.0 for x in idle), "the truth's idle replicas hold factors (else vacuous)"
    leaks, off_nominal = [], []
    for x in idle:
        ft, fe, tft, tfe = mine.rf[x, R_FT], mine.rf[x, R_FE], truth.rf[x, R_FT], truth.rf[x, R_FE]
        if (ft, fe) == (tft, tfe) and (tft != 1.0 or tfe not in (1.0, ef)):
            leaks.append(f"replica {x}: ft={ft:.4f} fe={fe:.4f}, the truth's factors of its last step")
        elif ft != 1.0 or not np.isclose(fe, ef, rtol=1e-12):
            off_nominal.append(f"replica {x}: ft={ft:.4f} fe={fe:.4f} (nominal: 1, {ef:.4f})")
        floor_w, g = mine.rf[x, R_FLOOR_W], int(mine.ri[x, R_GPU])
        if floor_w:
            implied = floor_w / np.array(nominal_floors)
            if np.any(np.isclose(implied, truth_pf[g], rtol=1e-9, atol=0.0)):
                leaks.append(f"replica {x}: its segment's floor / nominal idle power = {truth_pf[g]:.6f}, "
                             f"the truth's power factor of GPU {g}")
    assert not leaks + off_nominal, (f"{len(leaks)} truth factors and {len(off_nominal)} non-nominal factors in idle "
                                     "replicas of the snapshot:\n" + "\n".join(leaks + off_nominal))


# ================================================================================================ 3. deadlines
def _invert_deadlines(prof, alpha: float, arrival, prompt, deadline) -> np.ndarray:
    """The output length o with a + alpha L_ref(p, o) = d (L_ref strictly increasing in o >= 1): bisection for
    the smallest o whose L_ref reaches the target, vectorised over requests."""
    arrival, prompt, deadline = (np.asarray(x, dtype=np.float64) for x in (arrival, prompt, deadline))
    target = (deadline - arrival) / alpha
    tol = 1e-9 * np.maximum(1.0, np.abs(target))
    lo = np.ones(len(target), dtype=np.int64)
    hi = np.full(len(target), int(prof.scheduler.context_limit), dtype=np.int64)
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        ok = reference_latency(prof, prompt, mid) >= target - tol
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid + 1)
    return lo


def _recovered(env: CommitServeEnv):
    """(recovered, predicted, true) lengths of the live requests of a snapshot and of every arrived request
    (from the env's visible deadlines), with predictions capped at the context limit as the deadline is."""
    pool, tab, prof = env.pool, env.table, env.profile
    alpha = env.scenario.alpha
    cap = np.maximum(prof.scheduler.context_limit - tab.prompt_tokens, 1)
    snap = env.unwrapped.snapshot()
    rq = snap.requests
    slots = rq.slot
    rec_snap = _invert_deadlines(prof, alpha, rq.arrival_s, rq.prompt_tokens,
                                 [snap.deadlines[s] for s in slots.tolist()])
    n = pool.arrived
    rec_all = _invert_deadlines(prof, alpha, tab.arrival_s[:n], tab.prompt_tokens[:n], pool.visible_deadline[:n])
    pred = np.minimum(pool.pred_out, cap)
    return (rec_snap, pred[slots], pool.out_tokens[slots]), (rec_all, pred[:n], pool.out_tokens[:n])


def test_inverting_visible_deadlines_at_paper_gives_predictions_not_truth(paper_env):
    env = paper_env
    _busy(env, steps=6)
    sigma = env.realism.lengths.sigma
    for label, (rec, pred, true) in zip(("snapshot", "visible_deadline"), _recovered(env)):
        assert len(rec) > 50, label
        np.testing.assert_array_equal(rec, pred, err_msg=f"{label}: inversion should give the predicted length")
        exact = float(np.mean(rec == true))
        assert exact < 0.10, f"{label}: {exact:.1%} of true lengths recovered"
        assert exact <= float(np.mean(pred == true)) + 1e-12  # no better than the predictor
        if label == "visible_deadline":
            err = np.log(rec / true)
            assert abs(err.std() - sigma) < 0.08, f"log error std {err.std():.3f}, realism sigma {sigma}"


def test_inverting_deadlines_at_ideal_gives_the_true_lengths(ideal_env):
    """Documents why ``ideal`` is for reproduction only: its visible deadlines are the true ones."""
    env = ideal_env
    _busy(env, steps=6)
    for label, (rec, pred, true) in zip(("snapshot", "visible_deadline"), _recovered(env)):
        assert len(rec) > 50, label
        assert np.mean(rec == true) > 0.999, label
        assert np.mean(pred == true) < 0.5  # while the predictions themselves are noisy


# ================================================================================================ 4. seeds
class _Spy(Controller):
    """Records what a controller is handed: its seed, its context, the first observation and info, and the
    engine seed a snapshot would carry."""

    name = "spy"

    def __init__(self) -> None:
        self.first = None

    def act(self, observation, info):
        if self.first is None:
            self.first = (observation.copy(), dict(info))
        return self.ctx.action(self.ctx.n_replicas, self.ctx.reference_clock_mhz)


def test_controller_seed_is_one_way_and_does_not_rebuild_the_trace(paper_env):
    sc = load_scenario(PAPER)
    spy = _Spy()
    env, res = run_episode(spy, PAPER, SEED)
    assert spy.seed is not None and spy.seed != SEED
    assert spy.seed == derived_seed(SEED, "controller")
    assert not any(getattr(spy.ctx, f.name) == SEED for f in dataclasses.fields(spy.ctx))
    episode = env.table
    mine = scenario_workload(sc, spy.seed)
    assert len(mine) != len(episode) or not np.array_equal(mine.arrival_s, episode.arrival_s)
    again = scenario_workload(sc, SEED)  # the run seed itself does rebuild it: the derivation is one way only
    np.testing.assert_array_equal(again.arrival_s, episode.arrival_s)
    np.testing.assert_array_equal(again.output_tokens, episode.output_tokens)
    for s in (0, 1, SEED, 2**40 + 3):
        tags = {derived_seed(s, p) for p in ("workload", "controller", "arrivals")}
        assert len(tags) == 3 and s not in tags
    # the first observation and info say nothing about the seed (identical under another run seed)
    obs0, info0 = paper_env.reset(seed=SEED + 1)
    np.testing.assert_array_equal(spy.first[0], obs0)
    assert spy.first[1] == info0
    assert res.summary["seed"] == SEED


def _reachable_ints(*roots) -> set[int]:
    seen, _ = _walk(*roots)
    out: set[int] = set()
    for o in seen.values():
        if isinstance(o, (int, np.integer)) and not isinstance(o, bool):
            out.add(int(o))
        elif isinstance(o, np.ndarray) and o.dtype.kind in "iu":
            out.update(int(v) for v in np.unique(o))
    return out


def test_snapshot_does_not_carry_the_run_seed(paper_env):
    """The run seed regenerates the trace (arrivals and true lengths) and every truth factor: nothing a controller
    can reach may hold it or a seed derived from it."""
    env = paper_env
    run_seed = 2_000_000_011  # larger than any count, slot or token number, so a match is the seed
    _busy(env, seed=run_seed)
    snap = env.unwrapped.snapshot()
    recent = env.unwrapped.recent_arrivals(120.0)
    secret = {run_seed} | {derived_seed(run_seed, p) for p in ("workload", "controller", "arrivals")}
    found = _reachable_ints(snap, recent) & secret
    seed = getattr(getattr(getattr(snap, "_engine", None), "opt", None), "seed", None)
    where = f"snapshot.pool.opt.seed = {seed}" if seed in secret else "found by the object-graph walk"
    assert not found, f"the run seed is reachable from the snapshot ({where})"
    # and the attack it enables fails: whatever engine seed the snapshot has does not rebuild the trace
    if isinstance(seed, (int, np.integer)):
        rebuilt = scenario_workload(env.scenario, int(seed))
        assert len(rebuilt) != len(env.table) or not np.array_equal(rebuilt.output_tokens, env.table.output_tokens)


@pytest.mark.xfail(strict=True, reason="known leak (design): bench seed ranges are public and small, and derived_seed "
                   "is a public function: enumerating the declared test range inverts the controller's seed (closed on the "
                   "leaderboard: a secret suite's controller seed is its own secret stream, tests/leaderboard/test_leaderboard.py)")
def test_controller_seed_cannot_be_inverted_over_the_declared_seed_range():
    sc = load_scenario(PAPER)
    lo, hi = sc.seeds.test
    mine = derived_seed(SEED, "controller")
    hits = [s for s in range(lo, hi) if derived_seed(s, "controller") == mine]
    assert hits != [SEED], f"run seed {SEED} recovered from the controller's seed"


@pytest.mark.xfail(strict=True, reason="known leak (design): the generator and the test seeds are public; the first "
                   "minute of arrivals (recent_arrivals) identifies the trace, hence every true output length (closed on the "
                   "leaderboard: secret run seeds, tests/leaderboard/test_leaderboard_sandbox.py::"
                   "test_the_workload_cannot_be_rebuilt_from_a_secret_seed)")
def test_trace_cannot_be_identified_from_the_first_minute(paper_env):
    env = paper_env
    env.reset(seed=SEED)
    env.step({"active": env.n_replicas, "clock": env.profile.reference_clock_index})
    seen = env.unwrapped.recent_arrivals(60.0)  # shifted by +60 s to replay from now
    t_seen = seen.arrival_s - 60.0
    sc = env.scenario
    lo, hi = sc.seeds.test
    hits = []
    for s in range(lo, hi):
        cand = scenario_workload(sc, s)
        k = len(t_seen)
        if len(cand) >= k and np.allclose(cand.arrival_s[:k], t_seen, rtol=0, atol=1e-9):
            hits.append(s)
    identified = hits == [SEED]
    if identified:
        full = scenario_workload(sc, hits[0])
        identified = np.array_equal(full.output_tokens, env.table.output_tokens)
    assert not identified, "the episode's trace (with true lengths) was identified from one minute of arrivals"


@pytest.mark.xfail(strict=True, reason="known leak (in-process): EnvProbe keeps the env in closures, and a function's "
                   "__closure__ is public; the leaderboard sandbox's process boundary closes it there "
                   "(tests/leaderboard/test_leaderboard_sandbox.py::test_the_host_process_is_out_of_reach)")
def test_probe_does_not_reach_the_env_through_its_closures(paper_env):
    from commitenv_controllers import ControllerContext

    env = paper_env
    env.reset(seed=SEED)
    probe = ControllerContext.from_env(env).probe
    assert set(getattr(type(probe), "__slots__", ())) == {"snapshot", "recent_arrivals", "report_planning_delay"}
    assert not hasattr(probe, "__dict__")  # attributes: only the three callables
    reached = [c.cell_contents for f in (probe.snapshot, probe.recent_arrivals, probe.report_planning_delay)
               for c in (f.__closure__ or ())]
    assert not any(x is env.unwrapped for x in reached), "probe.snapshot.__closure__[0].cell_contents is the env"


@pytest.mark.xfail(strict=True, reason="known leak (in-process): a controller's act() is called from run_episode, and "
                   "Python frames are public: sys._getframe(1).f_locals holds run_episode's env (and with it the trace); "
                   "the leaderboard sandbox closes it (the child's frames are its own message loop, "
                   "tests/leaderboard/test_leaderboard_sandbox_attacks.py::test_the_callers_frames_hold_no_env)")
def test_act_cannot_reach_the_env_through_its_callers_frame():
    import sys

    class Seen(Exception):
        """Ends the episode after the first decision: one look is all the attack needs."""

    class Frames(Controller):
        name = "frames"
        found = False

        def act(self, observation, info):
            frame = sys._getframe(1)
            while frame is not None and not self.found:
                self.found = any(isinstance(v, CommitServeEnv) or isinstance(getattr(v, "unwrapped", None),
                                                                             CommitServeEnv)
                                 for v in frame.f_locals.values())
                frame = frame.f_back
            raise Seen

    ctrl = Frames()
    with pytest.raises(Seen):
        run_episode(ctrl, IDEAL, SEED)
    assert not ctrl.found, "sys._getframe(1).f_locals inside act() holds run_episode's env"


# ================================================================================================ 5. obs and info
def _interval_energies(env: CommitServeEnv, steps: int) -> tuple[np.ndarray, np.ndarray, list[float]]:
    env.reset(seed=SEED)
    settle = 1.0 + env.realism.meters.pool_overhead
    prev = 0.0
    info_j, settled, hour = [], [], []
    for k in range(steps):
        _, _, done, _, info = env.step({"active": env.n_replicas, "clock": env.profile.reference_clock_index})
        assert not done
        e = env.pool.energy_j(info["t"]) * settle  # the settlement meter the reward is computed from
        settled.append(e - prev)
        prev = e
        info_j.append(info["interval_energy_j"])
        hour.append(info["hour_energy_j"])
    return np.array(info_j), np.array(settled), hour


def test_info_energy_is_the_controller_meter_at_paper(paper_env):
    info_j, settled, hour = _interval_energies(paper_env, 8)
    rel = np.abs(info_j - settled) / settled
    assert np.all(rel > 1e-6), f"info reports the settlement meter in some interval: {rel}"
    assert np.all(rel < 0.1)  # the same quantity, read on another meter
    assert hour[-1] == pytest.approx(float(np.sum(info_j)), rel=1e-9)
    assert abs(hour[-1] - float(np.sum(settled))) > 1e-6 * hour[-1]


def test_info_energy_is_the_settlement_meter_at_ideal(ideal_env):
    info_j, settled, _ = _interval_energies(ideal_env, 8)
    np.testing.assert_allclose(info_j, settled, rtol=1e-12)


def _slack_features(pool, deadlines) -> np.ndarray:
    slots, _ = pool.live_state()
    s = deadlines[slots] - pool.now
    return np.array([np.tanh(s.min() / 60), np.tanh(s.mean() / 60), np.mean(s < 0)])


def test_obs_slack_features_use_visible_deadlines(paper_env):
    from commitenv.envs import OBS_FEATURES

    idx = [OBS_FEATURES.index(f) for f in ("slack_min", "slack_mean", "overdue_frac")]
    env = paper_env
    env.reset(seed=SEED)
    gaps = []
    for k in range(8):
        obs, *_ = env.step(_act(env, k))
        if not env.pool.live:
            continue
        vis = _slack_features(env.pool, env.pool.visible_deadline)
        true = _slack_features(env.pool, env.pool.deadline)
        np.testing.assert_allclose(obs[idx], vis, atol=2e-6, err_msg=f"step {k}")
        gaps.append(float(np.max(np.abs(vis - true))))
    assert gaps and max(gaps) > 1e-3, "true and visible slacks never differ: the check cannot see a leak"


# ================================================================================================ 6. misses
def test_misses_become_known_only_at_completion_at_paper(paper_env):
    """Under-serving (a quarter of the pool at the lowest clock): requests finish late during the hour and many
    never finish in it. Every step reports exactly the late completions the client has seen by then; a deadline
    passing unfinished is not a signal (its true deadline is not known), only the episode end counts those."""
    env = paper_env
    env.reset(seed=SEED)
    cum, new, t = [], [], []
    ret, done, k = 0.0, False, 0
    while not done:
        _, r, done, _, info = env.step({"active": env.n_replicas // 4, "clock": 0})
        ret += r
        cum.append(info["misses"])
        new.append(info["new_misses"])
        t.append((k + 1) * env.dt)
        k += 1
    fin, dl = env.pool.finish_t, env.pool.deadline
    total = score_episode(env, "quarter", SEED, 0.0, ret).summary["misses"]
    assert sum(new) == cum[-1] == total > 0
    old_rule_differs = False
    for tk, c in zip(t[:-1], cum[:-1]):
        seen_late = int(np.count_nonzero((fin <= tk) & (fin > dl)))
        assert c == seen_late, f"t={tk}: {c} misses reported, {seen_late} late completions seen by then"
        old = int(np.count_nonzero((dl < tk) & ~(fin <= dl)))  # deadline passed without a timely finish
        old_rule_differs |= old != c
    assert 0 < cum[-2] < total, "expected late completions in the hour and misses left for the end"
    assert old_rule_differs, "counting at deadlines would give the same numbers: the check cannot see the leak"
