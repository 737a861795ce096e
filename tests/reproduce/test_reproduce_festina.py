"""The Festina reproduction's report: means over seeds and the energy saving against the default, by hand."""

from __future__ import annotations

from commitenv.reproduce.festina import KEYS, report


def _row(energy, lat, models):
    r = {k: 1.0 for k in KEYS}
    r.update(energy_mj=energy, latency_attainment_pct=lat, latency_by_model=models,
             dispatch_us_per_arrival=None, local_us_per_step=None)
    return r


def test_report_means_and_saving_by_hand():
    m = {"a": {"requests": 1, "attainment_pct": 100.0}, "b": {"requests": 1, "attainment_pct": 90.0}}
    res = {"scenario": "x", "seeds": [1, 2], "wall_s": 3.0, "runs": {
        "vllm/1": _row(10.0, 99.0, m), "vllm/2": _row(12.0, 97.0, m),
        "festina/1": {**_row(5.0, 98.0, m), "dispatch_us_per_arrival": 10.0, "local_us_per_step": 50.0},
        "festina/2": {**_row(6.0, 96.0, m), "dispatch_us_per_arrival": 20.0, "local_us_per_step": 70.0}}}
    text = report(res)
    # energy 11 vs 5.5 MJ: 50.0 % less; latency attainment 98 vs 97: -1.00 points
    assert "50.0 % less energy" in text and "-1.00 points" in text
    assert "| MuxServe-like default (vllm) | 11.000 |" in text and "| Festina | 5.500 |" in text
    assert "DynamoLLM" not in text  # not run: no row
    assert text.count("| 1.0 | 1.0 | 1.0 |") == 2  # moves, cold starts, migrated requests (1.0 in every row here)
    assert "dispatch 15.0 us per arrival" in text and "60.0 us per step" in text
    for r in res["runs"].values():  # plans made in the compiled loop: no host time per step to report
        r["local_us_per_step"] = None
    assert "dispatch 15.0 us per arrival" in report(res) and "inside the compiled loop" in report(res)
    assert "| Festina | 100.00 | 90.00 |" in text


def test_commitment_variant_rows_are_means_by_hand():
    m = {"a": {"requests": 1, "attainment_pct": 100.0}}
    res = {"scenario": "x", "commit_scenario": "y", "seeds": [1, 2], "wall_s": 3.0,
           "runs": {"vllm/1": _row(10.0, 99.0, m), "festina/1": _row(5.0, 98.0, m)},
           "commit_runs": {"epact/1": {"energy_mj": 9.0, "cost_kwh_eq": 0.1, "mean_abs_dev_pct": 1.0,
                                       "attainment_pct": 99.0, "latency_attainment_pct": 98.0},
                           "epact/2": {"energy_mj": 11.0, "cost_kwh_eq": 0.3, "mean_abs_dev_pct": 3.0,
                                       "attainment_pct": 97.0, "latency_attainment_pct": 96.0}}}
    text = report(res)
    assert "On `y` (the commitment variant)" in text
    assert "| ePACT | 10.000 | 0.200 | 2.00 | 98.00 | 97.00 |" in text
    assert "| Festina | 5.000 | 0.200" not in text  # Festina has no commitment run here: no row


def test_family_ablation_rows_are_means_and_saving_lost_is_by_hand():
    m = {"a": {"requests": 1, "attainment_pct": 100.0}}
    fam = {"moves": 0, "rejected": 0, "requests": 10, "attainment_pct": 90.0, "latency_attainment_pct": 95.0,
           "ttft_attainment_pct": 96.0, "tbt_attainment_pct": 97.0, "wall_s": 1.0}
    res = {"scenario": "x", "seeds": [1], "wall_s": 3.0, "family_scenario": "z", "family_seeds": [1, 2],
           "runs": {"vllm/1": _row(10.0, 99.0, m), "festina/1": _row(5.0, 98.0, m)},
           "family_runs": {"MuxServe-like default (vllm)/1": {**fam, "energy_mj": 30.0},
                           "MuxServe-like default (vllm)/2": {**fam, "energy_mj": 34.0},
                           "Festina/1": {**fam, "energy_mj": 20.0, "moves": 10},
                           "Festina/2": {**fam, "energy_mj": 24.0, "moves": 12},
                           "consolidation off/1": {**fam, "energy_mj": 22.0},
                           "consolidation off/2": {**fam, "energy_mj": 24.0}}}
    text = report(res)
    assert "`z` (28 models" in text and "seeds 1, 2" in text
    assert "| MuxServe-like default (vllm) | 32.000 | 90.00 | 95.00 | 96.00 | 97.00 | 0.0 | - |" in text
    assert "| Festina | 22.000 | 90.00 | 95.00 | 96.00 | 97.00 | 11.0 | - |" in text
    # consolidation off: 23 MJ against Festina's 22 and the default's 32: 1 / 10 of the saving lost
    assert "| consolidation off | 23.000 | 90.00 | 95.00 | 96.00 | 97.00 | 0.0 | 10.0 |" in text
    assert "dispatch off" not in text  # not run: no row


def test_no_family_runs_no_family_section():
    m = {"a": {"requests": 1, "attainment_pct": 100.0}}
    res = {"scenario": "x", "seeds": [1], "wall_s": 3.0,
           "runs": {"vllm/1": _row(10.0, 99.0, m), "festina/1": _row(5.0, 98.0, m)}}
    assert "## The serverless family" not in report(res)


def test_run_writes_every_part_on_a_toy_shared_pool(tmp_path, monkeypatch):
    """The reproduction end to end on a toy shared pool standing in for all three scenarios: each controller and each
    ablation row runs once, and the report and results hold them (the figures themselves: docs/results/festina.md)."""
    import json

    from helpers.scenarios import shared_scenario

    import commitenv.reproduce.festina as rf

    path = str(shared_scenario(tmp_path / "s"))
    monkeypatch.setattr(rf, "SCENARIO", path)
    monkeypatch.setattr(rf, "COMMIT_SCENARIO", path)
    monkeypatch.setattr(rf, "FAMILY_SCENARIO", path)
    monkeypatch.setattr(rf, "DAY_SCENARIO", path)
    res = rf.run(tmp_path / "out", seeds=(0,), family_seeds=(0,), progress=False)
    assert set(res["runs"]) == {f"{c}/0" for c in rf.CONTROLLERS}
    assert set(res["family_runs"]) == {f"{label}/0" for label, _, _ in rf.ABLATION}
    assert set(res["day_runs"]) == {f"{label}/0" for label, _, _ in rf.DAY_ABLATION}
    assert "keep-alive off (every instance kept active)/0" not in res["day_runs"]
    text = (tmp_path / "out" / "report.md").read_text()
    assert text.count("## The serverless family") == 2 and "| keep-alive off (every instance kept active) |" in text
    assert json.loads((tmp_path / "out" / "results.json").read_text())["family_seeds"] == [0]
