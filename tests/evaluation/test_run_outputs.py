"""What an operator reads after a run: decisions.csv's per-interval energy, commitment pace, arrivals and misses
(checked against the summary's totals and the trace), the overview figure interval by interval, and the notice
when `run` or `compare` write nothing."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from commitenv.control import Controller
from commitenv.evaluation import evaluate
from helpers.scenarios import toy_miss


class Alternate(Controller):
    """One replica at the lowest clock on even intervals, two at the top clock on odd ones (decisions that change)."""

    name = "alternate"

    def reset(self, ctx, seed=None):
        super().reset(ctx, seed)
        self.k = 0

    def act(self, observation, info):
        ctx = self.ctx
        self.k += 1
        return ctx.action(1, ctx.clocks_mhz[0]) if self.k % 2 else ctx.action(2, ctx.clocks_mhz[-1])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("toy")
    sc = toy_miss(folder / "sc", commitment={"mj": [0.2, 0.3]})
    res = evaluate(Alternate(), str(sc), seed=0)
    out = res.write(folder / "out")
    return res, out


def test_decisions_carry_interval_energy_pace_arrivals_and_misses(run):
    res, out = run
    s = res.summary
    with open(out / "decisions.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 6  # two hours of the toy's ten-minute intervals
    assert [float(r["t_start_s"]) for r in rows[:3]] == [0.0, 600.0, 1200.0]
    assert {"energy_j", "commitment_pace_j", "arrivals", "misses"} <= set(rows[0])
    energy = np.array([float(r["energy_j"]) for r in rows])
    # invariant: the intervals' settled energies add up to the hours' energy (the tail is apart)
    assert energy.sum() == pytest.approx(s["energy_mj"] * 1e6, rel=1e-9)
    for h, hour in enumerate(res.hourly):
        assert energy[6 * h: 6 * (h + 1)].sum() == pytest.approx(hour["energy_mj"] * 1e6, rel=1e-9)
    assert np.all(energy > 0)
    # the commitment's even pace, by hand: 0.2 MJ and 0.3 MJ over 6 intervals
    pace = np.array([float(r["commitment_pace_j"]) for r in rows])
    assert np.allclose(pace[:6], 0.2e6 / 6) and np.allclose(pace[6:], 0.3e6 / 6)
    arrivals = np.array([int(r["arrivals"]) for r in rows])
    misses = np.array([int(r["misses"]) for r in rows])
    assert arrivals.sum() == s["requests"] and misses.sum() == s["misses"] > 0
    assert np.all(misses <= arrivals)
    # toy_miss's trace: one request at 0 s and 20 at 100 s (interval 0), 20 at 4000 s (interval 6), one at 7190 s
    assert arrivals[0] >= 21 and arrivals[6] >= 20 and arrivals[11] >= 1
    # the decisions themselves, as the controller gave them
    assert [int(r["active"]) for r in rows[:4]] == [1, 2, 1, 2]


def test_energy_only_hours_have_no_pace(tmp_path):
    sc = toy_miss(tmp_path / "sc", commitment={"energy_only": True})
    res = evaluate(Alternate(), str(sc), seed=0)
    assert all(d["commitment_pace_j"] is None for d in res.decisions)
    assert sum(d["energy_j"] for d in res.decisions) == pytest.approx(res.summary["energy_mj"] * 1e6, rel=1e-9)


def _overview(res, path):
    """The overview figure of ``res``, drawn from its records as `EvalResult.write` draws it."""
    from commitenv.plots import overview_figure

    return overview_figure(path, scenario=res.scenario, controller=res.controller, seed=res.seed, hourly=res.hourly,
                           intervals=res.interval_rows(), summary=res.summary)


def test_overview_shows_every_interval(run, tmp_path):
    res, out = run
    assert (out / "overview.png").stat().st_size > 0
    fig = _overview(res, tmp_path / "o.png")
    axes = {a.get_ylabel(): a for a in fig.axes}
    assert set(axes) == {"requests per interval", "energy per interval (MJ)", "hour's energy (MJ)",
                         "active replicas", "clock (MHz)"}
    n = 12

    def series(label: str) -> list[np.ndarray]:
        """Each step series of a panel: one value per interval, over edges every interval wide."""
        out = []
        for p in axes[label].patches:
            values, edges, _ = p.get_data()
            assert len(values) == n and np.allclose(np.diff(edges), 600 / 3600)  # ten-minute intervals, in hours
            out.append(np.asarray(values))
        return out

    arrivals, misses = series("requests per interval")
    assert arrivals.sum() == res.summary["requests"] and misses.sum() == res.summary["misses"]
    energy, pace = series("energy per interval (MJ)")
    assert energy.sum() == pytest.approx(res.summary["energy_mj"], rel=1e-9)
    assert np.allclose(pace[:6], 0.2 / 6) and np.allclose(pace[6:], 0.3 / 6)
    (active,) = series("active replicas")
    assert list(active[:4]) == [1, 2, 1, 2]
    (clock,) = series("clock (MHz)")
    assert set(clock) == {500, 1000}  # the toy's two levels, alternating
    (cum, committed) = axes["hour's energy (MJ)"].get_lines()
    assert len(cum.get_xdata()) == n
    assert cum.get_ydata()[5] == pytest.approx(res.hourly[0]["energy_mj"], rel=1e-9)  # the hour's end
    assert committed.get_ydata()[5] == pytest.approx(0.2) and committed.get_ydata()[11] == pytest.approx(0.3)


def test_overview_of_a_result_without_decision_rows(run, tmp_path):
    """A result scored from an env directly (no decision rows) is drawn from its history and request table."""
    from dataclasses import replace

    res, _ = run
    bare = replace(res, decisions=[])
    fig = _overview(bare, tmp_path / "o.png")
    axes = {a.get_ylabel(): a for a in fig.axes}
    energy, _ = (p.get_data()[0] for p in axes["energy per interval (MJ)"].patches)
    assert len(energy) == 12 and np.all(energy > 0)
    misses = axes["requests per interval"].patches[1].get_data()[0]
    assert misses.sum() == res.summary["misses"]


def test_run_and_compare_without_out_say_nothing_was_written(capsys):
    from commitenv.cli import main

    from helpers.scenarios import HOUR_SCENARIO

    assert main(["run", HOUR_SCENARIO, "--controller", "vllm", "--quiet", "--no-score"]) == 0
    out, err = capsys.readouterr()
    notes = [line for line in err.splitlines() if "nothing written" in line]
    assert len(notes) == 1 and "--out" in notes[0]
    assert "nothing written" not in out  # stdout's last line stays the summary's JSON
    assert main(["compare", HOUR_SCENARIO, "--controllers", "vllm", "--quiet", "--no-score"]) == 0
    _, err = capsys.readouterr()
    notes = [line for line in err.splitlines() if "nothing written" in line]
    assert len(notes) == 1 and "--out" in notes[0]
