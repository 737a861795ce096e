"""Planning time charged by the runner (`commitenv.planning`): the clock counts what a controller and its workers
spend, and a decision applies as late as it took to compute at realism levels that measure it."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from commitenv.control import Controller
from commitenv.evaluation import run_episode
from commitenv.planning import PlanningClock, quantize
from helpers.scenarios import toy_three_hour


def _burn(cpu_s: float) -> float:
    """Spin until this process has spent ``cpu_s`` of CPU (a CPU amount, not a duration: load cannot shorten it)."""
    t0 = time.process_time()
    x = 0
    while time.process_time() - t0 < cpu_s:
        x += 1
    return time.process_time() - t0


def test_quantize_rounds_half_up_and_refuses_bad_input():
    assert quantize(0.049, 0.1) == 0.0 and quantize(0.05, 0.1) == pytest.approx(0.1)
    assert quantize(23.36, 0.1) == pytest.approx(23.4) and quantize(0.123, 0.0) == 0.123
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="planning time"):
            quantize(bad, 0.1)


def test_clock_counts_this_process_and_live_and_finished_workers():
    clock = PlanningClock()
    with clock:
        _burn(0.2)
    assert clock.cpu_s >= 0.2 and clock.seconds >= clock.cpu_s
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:  # a live worker: counted through /proc while it stays alive
        pool.apply(time.sleep, (0.0,))  # started before the decision
        with clock:
            spent = pool.apply(_burn, (0.3,))
        assert spent >= 0.3 and clock.cpu_s >= 0.3 - 0.02  # /proc's tick (10 ms) on either end
    with clock:  # a worker that exits during the decision: counted through the reaped children's usage
        p = ctx.Process(target=_burn, args=(0.3,))
        p.start()
        p.join()
    assert clock.cpu_s >= 0.3 and clock.seconds >= 0.3


class SlowFirst(Controller):
    """Takes half a second of wall time over its first decision (one replica at the lowest clock), then keeps it."""

    def act(self, observation, info):
        if info.get("interval") == 0 and info.get("hour") == 0 and not getattr(self, "_done", False):
            self._done = True
            time.sleep(0.5)
        return {"active": 1, "clock": 0}


@pytest.mark.parametrize("realism, charged", [("paper", True), ("ideal", False)])
def test_a_slow_decision_applies_as_late_as_it_took(tmp_path, realism, charged):
    sc = toy_three_hour(tmp_path, horizon_hours=1, commitment={"mj": [0.2]}, realism=realism,
                        **({} if realism == "ideal" else {"name": "toy-paper"}))
    _, res = run_episode(SlowFirst(), str(sc), 0)
    first = res.decisions[0]
    if charged:
        assert first["measured_s"] >= 0.5 and first["planning_delay_s"] >= 0.5
        assert first["applied_s"] >= 0.5  # the change came when the decision was ready, not at the interval start
        assert res.summary["planning_delay_mode"] == "measured" and res.summary["planning_delay_s_max"] >= 0.5
    else:
        assert first["measured_s"] is None and first["planning_delay_s"] == 0.0 and first["applied_s"] == 0.0
    # the runner can leave its measurement out (the controller's own report then applies: 0)
    _, plain = run_episode(SlowFirst(), str(sc), 0, charge_planning=False)
    assert plain.decisions[0]["applied_s"] == 0.0 and plain.decisions[0]["measured_s"] is None


def test_fixed_mode_charges_exactly_its_seconds(tmp_path):
    sc = toy_three_hour(tmp_path, horizon_hours=1, commitment={"mj": [0.2]}, name="toy-fixed",
                        realism={"level": "paper", "planning_delay": {"mode": "fixed", "seconds": 7.5}})
    _, res = run_episode(SlowFirst(), str(sc), 0)
    assert res.decisions[0]["planning_delay_s"] == 7.5 and res.decisions[0]["applied_s"] == 7.5
    assert res.decisions[0]["measured_s"] is None


def test_bad_planning_delay_settings_name_the_field(tmp_path):
    from commitenv.scenarios import load_scenario

    for bad, field in (({"mode": "guessed"}, "planning_delay.mode"), ({"resolution_s": -1}, "resolution_s")):
        p = toy_three_hour(tmp_path, name="toy-bad", realism={"level": "paper", "planning_delay": bad})
        with pytest.raises(ValueError) as e:
            load_scenario(p)
        assert field.split(".")[-1] in str(e.value)
