"""Where the leaderboard commands find their board: `submit` outside a checkout without --board refuses with one
line instead of making a board (and running every reference episode) in the current folder; a board that lacks
references is told how many runs it will make first; the suite's record counts gate failures apart from lost
episodes."""

from __future__ import annotations

import logging
from pathlib import Path


from commitenv.leaderboard import references
from commitenv.leaderboard.score import suite_summary
from commitenv.leaderboard.suite import episodes, load_suite


def test_submit_without_board_outside_a_checkout_refuses(tmp_path: Path, capsys, monkeypatch) -> None:
    from commitenv.cli import main

    ctl = tmp_path / "ctl.py"
    ctl.write_text("raise SystemExit('never imported')\n")
    monkeypatch.chdir(tmp_path)
    assert main(["submit", f"{ctl}:Ctl"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: submit: no ./leaderboard folder here"), err
    assert "--board DIR" in lines[0] and "reference episodes" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctl.py"]  # nothing made, nothing run


def test_missing_references_are_counted_before_they_run(tmp_path: Path) -> None:
    suite, shash = load_suite("dev", tmp_path)
    eps = episodes(suite, shash)
    path = tmp_path / "references" / "dev.json"
    pair = (suite.lower, suite.upper)
    assert references.missing(path, eps, pair) == 2 * len(eps)
    have = {references.reference_key(eps[0], suite.lower): {"cost_kwh_eq": 1.0},
            references.reference_key(eps[1], suite.upper): {"cost_kwh_eq": 0.0},
            "stale-key": {"cost_kwh_eq": 5.0}}
    from commitenv import references as lib

    lib.save(path, have)
    assert references.missing(path, eps, pair) == 2 * len(eps) - 2


def test_submit_says_it_runs_the_missing_references_first(tmp_path: Path, caplog) -> None:
    """`submit`'s reference step logs how many runs it makes before making them (the runs are stubbed here)."""
    import importlib

    submit_mod = importlib.import_module("commitenv.leaderboard.submit")

    suite, shash = load_suite("dev", tmp_path)
    eps = episodes(suite, shash)[:2]
    ran: list[int] = []

    def fake_run(jobs, fn, desc):
        ran.append(len(jobs))
        return [{"summary": {"cost_kwh_eq": 1.0}} for _ in jobs]

    with caplog.at_level(logging.WARNING, logger="commitenv"):
        submit_mod._references(tmp_path, suite, eps, None, fake_run)
    msg = [r.getMessage() for r in caplog.records if "reference runs" in r.getMessage()]
    assert len(msg) == 1 and "holds 0 of the 4 reference runs" in msg[0] and "running the 4 missing ones first" in msg[0]
    assert ran == [4]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="commitenv"):
        submit_mod._references(tmp_path, suite, eps, None, fake_run)
    assert not [r for r in caplog.records if "reference runs" in r.getMessage()] and ran == [4]


def test_suite_summary_counts_gate_failures_apart_from_lost_episodes() -> None:
    def row(status: str, gate: bool) -> dict:
        return {"status": status, "slo_gate_pass": gate, "score": 1.0, "cost_kwh_eq": 0.1, "attainment_pct": 99.0,
                "misses": 1, "energy_mj": 1.0, "mean_abs_dev_pct": 1.0}

    rows = [row("ok", True), row("ok", False), row("ok", False), row("crash", False), row("timeout", True)]
    _, m = suite_summary(rows)
    assert (m["episodes"], m["slo_gate_pass"], m["gate_failures"], m["lost"], m["failed"]) == (5, 2, 2, 2, 2)
