"""Models that scale to zero (`EngineOptions.scale_to_zero`, a scenario's ``engine.scale_to_zero``): a model may have
no active instance, and a request that finds none wakes one. By hand (the wake adds the profile's activation latency to
the request's times, the GPU draws standby power until the wake), on the compiled loop and on the reference engine
alike, through the environment (actions 0..n, ``check_env``), and the refusals without it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from helpers.reference import ReferencePool, step_by_step, use_engine
from helpers.scenarios import shared_scenario

from commitenv.envs import CommitServeEnv
from commitenv.profiles import load_profile
from commitenv.scenarios import ScenarioError, load_scenario
from commitenv.sim import EngineOptions, NoiseSpec
from commitenv.sim.pool import Instance, Pool, PoolLayout
from commitenv.workload.table import make_table

QWEN, LLAMA = "h100-qwen2.5-7b-festina", "h100-llama2-13b"
ENGINES = {"library": Pool, "reference": ReferencePool}


def _pool(engine: str, scale_to_zero: bool):
    """Qwen alone on GPU 0, Llama alone on GPU 1; one Llama request (500 prompt, 20 output tokens) at t = 10 s."""
    q, ll = load_profile(QWEN), load_profile(LLAMA)
    pool = ENGINES[engine]([q, ll], PoolLayout(((Instance(0, 1.0),), (Instance(1, 1.0),))),
                           EngineOptions(noise=NoiseSpec(0, 0), scale_to_zero=scale_to_zero))
    pool.attach(make_table([10.0], [500], [20], tenant=[1], tenant_names=("q", "l")), tenant_model={0: 0, 1: 1})
    return pool, ll


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_for_a_model_at_zero_wakes_it_and_waits_its_activation_by_hand(engine):
    always, ll = _pool(engine, False)
    always.run_until(np.inf)
    s2z, _ = _pool(engine, True)
    s2z.set_active(0.0, 0, model=1)
    assert s2z.active_count(1) == 0
    s2z.run_until(9.0)
    assert s2z.active_count(1) == 0  # nothing woke it before its request
    wake = ll.latencies.activation_s
    assert wake == 3.0
    s2z.run_until(np.inf)
    assert s2z.active_count(1) == 1  # woken by its request, active since (a controller scales it in)
    # the request starts when the instance is up: every time of it shifts by the activation latency
    assert s2z.first_t[0] == pytest.approx(always.first_t[0] + wake, rel=1e-12)
    assert s2z.finish_t[0] == pytest.approx(always.finish_t[0] + wake, rel=1e-12)
    # the meter: GPU 1 stood by (69 W) until the request arrived, then idled as a waking instance (active idle)
    idle = ll.clocks[ll.reference_clock_index].active_idle_w
    assert ll.standby_w == 69.0
    meters = []
    for t in (10.0, 13.0):
        a, _ = _pool(engine, False)
        z, _ = _pool(engine, True)
        z.set_active(0.0, 0, model=1)
        a.run_until(t)
        z.run_until(t)
        meters.append((a.gpu_energy_j(t), z.gpu_energy_j(t)))
    (a10, z10), (a13, z13) = meters
    assert a10[1] == pytest.approx(idle * 10.0, rel=1e-12) and z10[1] == pytest.approx(69.0 * 10.0, rel=1e-12)
    assert z13[1] == pytest.approx(69.0 * 10.0 + idle * 3.0, rel=1e-12)
    assert z13[0] == pytest.approx(a13[0], rel=1e-12)  # Qwen's GPU: the same in both runs


@pytest.mark.parametrize("engine", ENGINES)
def test_scaling_a_model_with_queued_work_to_zero_keeps_an_instance_serving(engine):
    """A request queued but not started when its model is set to 0 finds no active instance: the draining one resumes
    at once (no activation latency), so the request is served as if nothing had been asked."""
    always, _ = _pool(engine, False)
    always.run_until(np.inf)
    s2z, _ = _pool(engine, True)
    s2z.run_until(10.0)  # the request has arrived and started its prefill
    s2z.set_active(10.0, 0, model=1)
    s2z.run_until(np.inf)
    assert s2z.finish_t[0] == pytest.approx(always.finish_t[0], rel=1e-12)
    assert s2z.active_count(1) == 0  # it ran its started request to the end, draining, and stood by


@pytest.mark.parametrize("engine", ENGINES)
def test_zero_active_is_refused_without_scale_to_zero(engine):
    pool, _ = _pool(engine, False)
    with pytest.raises(ValueError, match=r"expected 1\.\.1 for model 1, got 0"):
        pool.set_active(0.0, 0, model=1)


def _s2z_scenario(tmp_path, **engine):
    return shared_scenario(tmp_path, name="toy-s2z", engine={"scale_to_zero": True, **engine}, interval_s=300)


def _random_zero_episode(monkeypatch, tmp_path, reference: bool) -> list:
    step_by_step(monkeypatch)
    use_engine(monkeypatch, reference)
    env = CommitServeEnv(str(_s2z_scenario(tmp_path)))
    env.reset(seed=7)
    rng = np.random.default_rng(11)
    out = []
    done = False
    while not done:
        a = {"active": [int(rng.integers(0, n + 1)) for n in env.replicas_per_model],
             "clock": int(rng.integers(len(env.clocks_mhz)))}
        obs, r, done, _, info = env.step(a)
        out.append((obs.tolist(), r, info["new_misses"], a["active"], [env.pool.active_count(m) for m in range(2)]))
    return out


def test_an_environment_scaling_to_zero_is_the_same_on_either_engine(monkeypatch, tmp_path):
    got = _random_zero_episode(monkeypatch, tmp_path, False)
    ref = _random_zero_episode(monkeypatch, tmp_path, True)
    assert got == ref and len(got) == 12
    # some interval set a model to zero and its requests woke it again
    assert any(a == 0 and c > 0 for *_, asked, counts in got for a, c in zip(asked, counts))


def test_the_env_takes_zero_active_only_where_the_scenario_scales_to_zero(tmp_path):
    from gymnasium.utils.env_checker import check_env

    env = CommitServeEnv(str(_s2z_scenario(tmp_path)))
    assert env.action_space["active"].start.tolist() == [0, 0]
    assert env.action_space["active"].nvec.tolist() == [4, 3]  # small: 0..3 instances, big: 0..2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env, skip_render_check=True)
    env.reset(seed=0)
    env.step({"active": [0, 2], "clock": 0})
    from commitenv.envs.wrappers import SharedFlatActionWrapper

    flat = SharedFlatActionWrapper(env)
    assert flat.action_space.nvec.tolist()[:2] == [4, 3]
    assert flat.action(np.zeros(flat.action_space.shape, np.int64))["active"].tolist() == [0, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(flat, skip_render_check=True)
    plain = CommitServeEnv(str(shared_scenario(tmp_path / "plain")))
    plain.reset(seed=0)
    with pytest.raises(ValueError, match=r"action\['active'\]\[0\]: expected 1\.\.3 instances"):
        plain.step({"active": [0, 2], "clock": 0})


def test_scale_to_zero_is_refused_on_a_one_model_pool(tmp_path):
    from helpers.scenarios import toy_three_hour

    path = toy_three_hour(tmp_path, engine={"scale_to_zero": True})
    with pytest.raises(ScenarioError, match="engine.scale_to_zero: only for a shared pool"):
        load_scenario(path)


def test_the_context_lets_a_controller_ask_for_zero(tmp_path):
    from commitenv.control import ControllerContext

    env = CommitServeEnv(str(_s2z_scenario(tmp_path)))
    env.reset(seed=0)
    ctx = ControllerContext.from_env(env)
    assert ctx.scale_to_zero and ctx.action((0, 1), ctx.clocks_mhz[0])["active"] == [0, 1]
    plain = CommitServeEnv(str(shared_scenario(tmp_path / "plain")))
    plain.reset(seed=0)
    with pytest.raises(ValueError, match=r"active\[0\]: expected a whole number in 1\.\.3"):
        ControllerContext.from_env(plain).action((0, 1), ctx.clocks_mhz[0])
