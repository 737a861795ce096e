"""The hardware runner's lag behind real time: measured (arrivals routed late, the fakes' steps longer than their
law), held to a stated bound (warn and mark the run, or abort), with the lag forced by a clock that oversleeps,
never by how fast this machine happens to be."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from commitenv.backends.clock import ScaledClock, VirtualClock
from commitenv.backends.fake_engine import SimEngine
from commitenv.backends.fake_gpu import FakeGpu
from commitenv.backends.lag import LagBound, LagMeter, ReplayLagError
from commitenv.backends.pool import HardwarePool
from commitenv.sim.noise import NoiseSpec
from commitenv.sim.pool import EngineOptions
from commitenv.workload.table import RequestTable
from helpers.profiles import toy_profile

OPTS = EngineOptions(noise=NoiseSpec(0, 0), alpha=10.0, length_error_sigma=0.0)


class OversleepClock(VirtualClock):
    """Virtual time, moved only by sleeps: a host that cannot keep up, made deterministic. A sleep of the engines'
    threads (``who="engines"``) or of the pool's replay thread (``who="replay"``) lasts ``factor`` times as long as
    asked, plus ``extra_s``. With ``others_wait`` the other threads' sleeps move no time (they wait, in real time,
    for it to move), so one engine's steps and the replay's strides do not lengthen each other; without it they
    move it as asked. ``speed`` lets the replay loop sleep in long strides."""

    speed = 1000.0

    def __init__(self, factor: float = 1.0, extra_s: float = 0.0, who: str = "engines",
                 others_wait: bool = False) -> None:
        super().__init__()
        self.factor, self.extra_s, self.who, self.others_wait = factor, extra_s, who, others_wait
        self._lock = threading.Lock()  # the engines' and the replay's threads advance it: no lost update

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        engine = threading.current_thread().name.startswith("commitenv-gpu")
        if engine == (self.who == "engines"):
            seconds = seconds * self.factor + self.extra_s
        elif self.others_wait:
            time.sleep(1e-4)
            return
        with self._lock:
            self.advance(seconds)


def _table(n: int = 12, span_s: float = 50.0) -> RequestTable:
    t = np.linspace(0.0, span_s, n)
    return RequestTable(arrival_s=t, prompt_tokens=np.full(n, 12), output_tokens=np.full(n, 6),
                        tenant=np.zeros(n, dtype=np.int32), request_id=np.arange(n, dtype=np.int64))


def _pool(clock, bound):
    prof = toy_profile()
    g = FakeGpu(prof, clock, 0)
    return HardwarePool(prof, [(g, SimEngine(prof, g, clock))], clock, OPTS, lag_bound=bound)


# ------------------------------------------------------------------------------------------ the meter, by hand
def test_meter_and_bound_by_hand():
    m = LagMeter(late_arrival_s=1.0)
    for due, at in [(0.0, 0.1), (1.0, 1.0), (2.0, 4.5), (3.0, 3.2)]:
        m.routed(due, at)
    assert (m.arrivals, m.late_arrivals) == (4, 1)  # lags 0.1, 0, 2.5, 0.2: one more than 1 s
    assert m.max_arrival_lag_s == pytest.approx(2.5) and m.worst_arrival_t == 2.0
    assert m.late_arrivals_pct == pytest.approx(25.0)
    m.modelled_step_s, m.step_overrun_s = 8.0, 2.0
    assert m.step_overrun_pct == pytest.approx(25.0)
    assert m.check(LagBound(max_late_arrivals_pct=30.0, max_step_overrun_pct=30.0), 10.0) is None
    assert m.summary()["backend_lagging"] is False
    why = m.check(LagBound(max_late_arrivals_pct=30.0, max_step_overrun_pct=20.0), 12.0)
    assert "25 % longer than their modelled time" in why and "arrivals" not in why
    why2 = m.check(LagBound(), 14.0)  # the default: 1 % of arrivals more than 1 s late, 25 % overrun
    assert "25.0 % of the arrivals were routed more than 1 s late" in why2 and "due at 2.0 s" in why2
    with pytest.raises(ValueError, match="counts arrivals more than 1 s late"):
        m.check(LagBound(late_arrival_s=2.0), 16.0)
    s = m.summary()
    assert s["backend_lagging"] is True and s["backend_lag_reason"] == why  # the first reason is kept
    assert s["backend_max_arrival_lag_s"] == pytest.approx(2.5) and s["backend_step_overrun_pct"] == pytest.approx(25.0)
    assert s["backend_late_arrivals_pct"] == pytest.approx(25.0) and s["backend_late_arrival_s"] == 1.0


@pytest.mark.parametrize("kw, field", [({"late_arrival_s": -1.0}, "late_arrival_s"),
                                       ({"max_step_overrun_pct": float("nan")}, "max_step_overrun_pct"),
                                       ({"on_exceed": "ignore"}, "on_exceed")])
def test_bad_bound_is_refused(kw, field):
    with pytest.raises(ValueError, match=field):
        LagBound(**kw)


# ------------------------------------------------------------------------------------------ forced lag
def test_a_pool_that_keeps_up_is_not_lagging():
    """All arrivals at 0 s; the one engine's steps last exactly their law; the replay moves no time."""
    hw = _pool(OversleepClock(others_wait=True), LagBound(on_exceed="abort"))
    try:
        hw.attach(_table(span_s=0.0))
        hw.run_until(float("inf"))
    finally:
        hw.close()
    lag = hw.lag
    assert lag.exceeded is None and (lag.arrivals, lag.late_arrivals, lag.max_arrival_lag_s) == (12, 0, 0.0)
    assert lag.modelled_step_s > 0 and lag.step_overrun_pct == pytest.approx(0.0, abs=1e-9)
    assert hw.completed == 12


def test_steps_that_overrun_their_law_abort_the_run():
    """The engine's steps last three times their law: 200 % over, past the 25 % bound."""
    hw = _pool(OversleepClock(factor=3.0, others_wait=True), LagBound(on_exceed="abort"))
    try:
        hw.attach(_table(span_s=0.0))
        with pytest.raises(ReplayLagError, match=r"steps took 200 % longer than their modelled time") as e:
            hw.run_until(float("inf"))  # (until every request is served: every step is in)
    finally:
        hw.close()
    assert "fake:SPEED" in str(e.value)
    assert hw.lag.step_overrun_pct == pytest.approx(200.0)


def test_late_arrivals_warn_once_and_mark_the_run(caplog):
    """Every sleep of the replay lasts 2 s more: each arrival (one every 50/11 s) is routed 2 s late, but the first
    (at 0 s) and the one at 31.8 s, which the replay reaches from the boundary at 30 s overslept to 32 s."""
    hw = _pool(OversleepClock(extra_s=2.0, who="replay", others_wait=True), LagBound())
    try:
        hw.attach(_table())
        with caplog.at_level("WARNING", logger="commitenv"):
            hw.run_until(30.0)
            hw.run_until(60.0)
    finally:
        hw.close()
    warnings = [r for r in caplog.records if "fell behind real time" in r.getMessage()]
    assert len(warnings) == 1 and "marked backend_lagging" in warnings[0].getMessage()
    lag = hw.lag
    assert (lag.arrivals, lag.late_arrivals) == (12, 10) and lag.max_arrival_lag_s == pytest.approx(2.0)
    s = lag.summary()
    # first exceeded at the boundary at 30 s: 8 arrivals routed by then (the one at 31.8 s at 32 s), 6 of them late
    assert s["backend_lagging"] is True and s["backend_lag_reason"].startswith(
        "by trace time 30 s, 75.0 % of the arrivals were routed more than 1 s late")
    assert s["backend_step_overrun_pct"] == 0.0  # the engine's steps moved no time


def test_no_bound_measures_without_judging():
    hw = _pool(OversleepClock(factor=3.0, others_wait=True), None)
    try:
        hw.attach(_table(span_s=0.0))
        hw.run_until(float("inf"))
    finally:
        hw.close()
    assert hw.lag.exceeded is None and hw.lag.step_overrun_pct == pytest.approx(200.0)


class SlowStepClock(ScaledClock):
    """A scaled wall clock on which the engines' sleeps last ``factor`` times as long: every step at least that much
    over its law, however fast or loaded the machine (a loaded one only adds to it)."""

    def __init__(self, speed: float, factor: float) -> None:
        super().__init__(speed)
        self.factor = factor

    def sleep(self, seconds: float) -> None:
        if threading.current_thread().name.startswith("commitenv-gpu"):
            seconds *= self.factor
        super().sleep(seconds)


def test_a_lagging_run_is_marked_in_its_summary_and_figure(tmp_path):
    """The episode runner records the lag; a lagging run says so in summary.json and in overview.png's title."""
    from commitenv.evaluation import run_episode
    from commitenv.plots import overview_figure
    from helpers.scenarios import toy_three_hour

    sc = toy_three_hour(tmp_path / "sc", horizon_hours=1, commitment={"mj": [0.2]}, alpha=30.0, name="toy-lag")

    def backend(profile, n, options, clock_mhz):
        clock = SlowStepClock(1000.0, 3.0)
        devices = []
        for i in range(n):
            g = FakeGpu(profile, clock, i)
            devices.append((g, SimEngine(profile, g, clock)))
        return HardwarePool(profile, devices, clock, options, clock_mhz=clock_mhz, lag_bound=LagBound())

    _, res = run_episode("vllm", str(sc), 0, backend=backend)
    s = res.summary
    assert s["backend"] == "hardware" and s["backend_lagging"] is True
    assert s["backend_step_overrun_pct"] >= 200.0 - 1e-6
    fig = overview_figure(tmp_path / "o.png", scenario=res.scenario, controller=res.controller, seed=res.seed,
                          hourly=res.hourly, intervals=res.interval_rows(), summary=res.summary)
    assert "REPLAY LAGGED BEHIND REAL TIME" in fig.axes[0].get_title()


@pytest.mark.parametrize("spec", ["fake:0", "fake:-3", "fake:inf", "fake:nan", "fake:abc", "fake:", "fake:2:3"])
def test_malformed_backend_specs_give_one_error(spec, capsys):
    from commitenv.cli import main
    from helpers.scenarios import HOUR_SCENARIO

    assert main(["run", HOUR_SCENARIO, "--backend", spec, "--quiet", "--no-score"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --backend {spec}: SPEED must be a finite number > 0")
    assert lines[0].endswith(f"got {spec.partition(':')[2]!r}")
    assert "Traceback" not in err + out
