"""Malformed input refused with one clear error naming the field (issue 34's list): a what-if's horizon and active
count, ePACT's planning delay, calibrate's --fake-noise, --clocks, --out and --seed, run's --seed, and an Azure
trace dated before 1970. Each was accepted silently, or failed without naming the field, before."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.scenarios import toy_three_hour

from commitenv.cli import main
from commitenv.envs.commit_serve import CommitServeEnv
from commitenv.workload.loaders import load_azure_csv


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    toy = toy_three_hour(tmp_path_factory.mktemp("bad") / "sc", horizon_hours=1, commitment={"mj": [0.2]},
                         name="toy-one")
    env = CommitServeEnv(str(toy))
    env.reset(seed=0)
    env.step({"active": 2, "clock": 0})
    return env, env.snapshot()


@pytest.mark.parametrize("horizon", [-1.0, math.nan, math.inf, -math.inf, True, "600"])
def test_simulate_refuses_a_bad_horizon(snap, horizon):
    env, s = snap
    with pytest.raises(ValueError, match="simulate: horizon_s must be a finite number of seconds >= 0"):
        s.simulate(1, env.clocks_mhz[0], horizon)


@pytest.mark.parametrize("active", [4.0, 1.5, True, np.float64(2.0), (1.0,), (), "2", None])
def test_simulate_refuses_an_active_count_that_is_not_whole(snap, active):
    env, s = snap
    with pytest.raises(ValueError, match="simulate: active must be a whole number"):
        s.simulate(active, env.clocks_mhz[0], 600.0)


def test_simulate_still_takes_whole_numbers_and_a_zero_horizon(snap):
    env, s = snap
    a = s.simulate(np.int64(2), env.clocks_mhz[-1], 600.0)
    b = s.simulate(2, env.clocks_mhz[-1], 600)
    assert a == b
    assert s.simulate(1, env.clocks_mhz[0], 0.0).energy_j == 0.0
    with pytest.raises(ValueError, match="max_tail_s"):
        s.simulate(1, env.clocks_mhz[0], 600.0, max_tail_s=-5.0)


@pytest.mark.parametrize("delay", [-1, -0.5, math.nan, math.inf, True, "fast"])
def test_epact_refuses_a_bad_planning_delay(delay):
    from commitenv_controllers.epact.controller import EPACT

    with pytest.raises(ValueError, match="planning_delay"):
        EPACT(planning_delay=delay, workers=0)


def test_epact_takes_a_good_planning_delay():
    from commitenv_controllers.epact.controller import EPACT

    assert EPACT(planning_delay=0.5, workers=0).planning_delay == 0.5
    assert EPACT(planning_delay="measured", workers=0).planning_delay == "measured"


@pytest.mark.parametrize("args, says", [
    (["--fake-noise", "-1"], "argument --fake-noise: expected a lognormal sigma in [0, 1], got -1"),
    (["--fake-noise", "nan"], "argument --fake-noise: expected a lognormal sigma in [0, 1], got nan"),
    (["--fake-noise", "5"], "argument --fake-noise: expected a lognormal sigma in [0, 1], got 5"),
    (["--clocks", ""], "argument --clocks: expected clock levels in MHz separated by commas"),
    (["--clocks", "abc"], "argument --clocks: 'abc' is not a clock level in MHz"),
    (["--clocks", "1980,,1410"], "argument --clocks: expected clock levels"),
    (["--clocks", "1980,1980"], "argument --clocks: a clock level given twice"),
    (["--seed", "-1"], "argument --seed: expected a whole number >= 0, got -1"),
])
def test_calibrate_refuses_bad_options_naming_them(tmp_path, capsys, args, says):
    out = tmp_path / "p.yaml"
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "--fake", "h200-qwen3.8-27b-fp8", "--out", str(out), "--quick", *args])
    assert e.value.code == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


def test_calibrate_refuses_an_out_under_a_file_before_measuring(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    assert main(["calibrate", "--fake", "h200-qwen3.8-27b-fp8", "--out", str(f / "sub" / "p.yaml"), "--quick"]) == 2
    err = capsys.readouterr().err
    assert f"--out {f / 'sub' / 'p.yaml'}: cannot create it ({f} is a file, not a folder)" in err
    assert main(["calibrate", "--fake", "h200-qwen3.8-27b-fp8", "--out", str(tmp_path), "--quick"]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_calibrate_warns_when_the_profile_fits_poorly(tmp_path, capsys):
    """--fake-noise 1 (the largest allowed) gives a validation latency WAPE near 0.9: said on stderr; a quiet
    calibration says nothing."""
    out = tmp_path / "noisy.yaml"
    assert main(["calibrate", "--fake", "h200-qwen3.8-27b-fp8", "--out", str(out), "--quick", "--fake-noise", "1"]) == 0
    err = capsys.readouterr().err
    assert out.is_file() and "warning: the profile fits its validation runs poorly (latency WAPE" in err
    assert "--fake-noise 1 is large" in err
    assert main(["calibrate", "--fake", "h200-qwen3.8-27b-fp8", "--out", str(tmp_path / "q.yaml"), "--quick"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_calibrate_function_refuses_bad_seed_and_clocks():
    from commitenv.backends.calibrate import calibrate

    for kw, says in (({"seed": -1}, "seed"), ({"clocks_mhz": []}, "clocks_mhz"), ({"clocks_mhz": [1980, 1980]},
                                                                                  "clocks_mhz"),
                     ({"clocks_mhz": [1980.0]}, "clocks_mhz")):
        with pytest.raises(ValueError, match=says):
            calibrate(None, None, None, None, **kw)


def test_run_refuses_a_negative_seed_naming_the_option(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "epact-h200-hour-fixed-a30", "--controller", "vllm", "--seed", "-1", "--quiet"])
    assert e.value.code == 2
    assert "argument --seed: expected a whole number >= 0, got -1" in capsys.readouterr().err


def test_an_azure_trace_dated_before_1970_is_refused(tmp_path):
    p = tmp_path / "old.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1969-12-31 23:59:59.5,10,5\n1970-01-01 00:00:01,10,5\n")
    with pytest.raises(ValueError) as e:
        load_azure_csv(p)
    msg = str(e.value)
    assert f"{p}: line 2" in msg and "TIMESTAMP" in msg and "before 1970-01-01" in msg and "1969-12-31 23:59:59" in msg
    ok = tmp_path / "ok.csv"
    ok.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\n"
                  "2023-11-16 18:15:47,10,5\n")
    assert len(load_azure_csv(ok)) == 2
