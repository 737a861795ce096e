"""Controllers from anywhere (``NAME | module:Class | path/to/file.py:Class``), entry points of the group
``commitenv.controllers``, ``--controller-arg``, ``commitenv controllers``, compare going on past a failing
controller, decisions.csv, and many seeds (``--seeds``, ``--jobs``, resume, mean and 95 % CI)."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import commitenv.evaluation as ev
import commitenv_controllers
import commitenv.registry as registry
from commitenv.cli import main
from commitenv.evaluation import evaluate
from commitenv.runner import mean_ci95, parse_seeds, t975
from commitenv_controllers import Controller, make, resolve
from helpers.paths import ROOT
from helpers.scenarios import toy_three_hour
from helpers.summaries import per_seed as _per_seed


CONTROLLER_FILE = '''
"""A user's controller file (not a package, not registered)."""
from commitenv_controllers import Controller


class HalfPool(Controller):
    """Half the pool at clock level ``level``; reports a planning delay of ``delay`` s."""

    def __init__(self, level: int = 1, frac: float = 0.5, label: str = "x", delay: float = 0.0,
                 fail_at: int | None = None) -> None:
        self.level, self.frac, self.label, self.delay, self.fail_at = level, frac, label, delay, fail_at
        self.k = 0

    def act(self, observation, info):
        if self.fail_at is not None and self.k == self.fail_at:
            raise RuntimeError(f"broken at interval {self.k}")
        self.k += 1
        if self.delay:
            self.ctx.probe.report_planning_delay(self.delay)
        return {"active": max(1, round(self.ctx.n_replicas * self.frac)), "clock": self.level}

    def stats(self):
        return {"half_frac": self.frac, "half_label": "text is not recorded", "half_flag": True}


class Alternating(Controller):
    """1 and 2 replicas in turn, at the top clock."""

    def act(self, observation, info):
        self.k = getattr(self, "k", -1) + 1
        if self.k == 3:
            self.ctx.probe.report_planning_delay(700.0)  # later than the 600-s interval: stale
        return {"active": 1 + self.k % 2, "clock": 1}


class NotAController:
    pass


class Labelled(Controller):
    """Names itself."""

    name = "labelled"

    def act(self, observation, info):
        return {"active": 1, "clock": 1}


from commitenv_controllers.vllm import VLLMController  # noqa: E402


class MyVLLM(VLLMController):
    """A variant of a registered controller: not registered itself."""
'''


# ------------------------------------------------------------------------------------------ helpers
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("plugins")
    ctl = d / "my_controllers.py"
    ctl.write_text(CONTROLLER_FILE)
    (d / "broken_ctl.py").write_text("import not_a_module_anywhere_xyz\n")
    return SimpleNamespace(dir=d, ctl=ctl, scenario=toy_three_hour(d / "sc"))


def _one_error(capsys, rc: int, *fragments: str) -> str:
    out, err = capsys.readouterr()
    assert rc != 0
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    for f in fragments:
        assert f in lines[0], lines[0]
    assert "Traceback" not in err + out
    return lines[0]


def _run_json(capsys, argv: list[str]) -> dict:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# ------------------------------------------------------------------------------------------ controllers from anywhere
def test_controller_from_a_file_is_named_after_its_class_and_rebuilt_by_attribute(files, tmp_path, capsys,
                                                                                   monkeypatch):
    out = tmp_path / "run"
    s = _run_json(capsys, ["run", str(files.scenario), "--controller", f"{files.ctl}:HalfPool",
                           "--controller-arg", "frac=1", "--controller-arg", "label=123", "--out", str(out), "--quiet"])
    assert s["controller"] == "HalfPool"
    assert s["controller_origin"] == f"path:{files.ctl.resolve()}:HalfPool"
    assert s["controller_kwargs"] == {"frac": 1, "label": "123"}  # JSON number 1; text kept for a str parameter
    assert s["half_frac"] == 1 and "half_label" not in s and "half_flag" not in s  # numeric stats() entries only
    assert json.loads((out / "summary.json").read_text()) == s
    # attribute rebuilds the controller from the recorded origin and arguments, and checks it reproduces the run
    assert main(["attribute", str(out), "--quiet"]) == 0, capsys.readouterr().err
    bills = _read_csv(out / "bills.csv")
    assert len(bills) == s["requests"]
    # the same file by a relative path resolves to the same origin
    monkeypatch.chdir(files.dir)
    assert resolve("my_controllers.py:HalfPool").origin == s["controller_origin"]


def test_attribute_names_a_missing_controller_file(files, tmp_path, capsys):
    ctl = tmp_path / "gone.py"
    ctl.write_text(CONTROLLER_FILE)
    out = tmp_path / "run"
    _run_json(capsys, ["run", str(files.scenario), "--controller", f"{ctl}:HalfPool", "--out", str(out), "--quiet"])
    ctl.unlink()
    _one_error(capsys, main(["attribute", str(out), "--quiet"]), "cannot re-run the episode", "gone.py", "not found")


def test_controller_from_a_module(files, tmp_path, capsys, monkeypatch):
    pkg = tmp_path / "mypkg_h7"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ctl.py").write_text(CONTROLLER_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    s = _run_json(capsys, ["run", str(files.scenario), "--controller", "mypkg_h7.ctl:HalfPool", "--quiet"])
    assert s["controller"] == "HalfPool" and s["controller_origin"] == "module:mypkg_h7.ctl:HalfPool"
    # a registered class given by module keeps its registered name
    r = resolve("commitenv_controllers.vllm:VLLMController")
    assert r.name == "vllm" and r.origin == "module:commitenv_controllers.vllm:VLLMController"
    assert resolve("commitenv_controllers:StaticTarget").name == "static_target"


@pytest.mark.parametrize(
    "spec, fragments",
    [
        ("{dir}/nope.py:HalfPool", ["nope.py not found"]),
        ("{dir}/my_controllers.py:Nope", ["has no class 'Nope'", "Alternating, HalfPool"]),
        ("{dir}/my_controllers.py:NotAController", ["NotAController is not a Controller subclass"]),
        ("{dir}/broken_ctl.py:X", ["cannot be imported", "No module named 'not_a_module_anywhere_xyz'"]),
        ("no_such_module_h7.sub:X", ["module 'no_such_module_h7.sub' cannot be imported",
                                     "ModuleNotFoundError: No module named 'no_such_module_h7'"]),
        ("json:JSONDecoder", ["JSONDecoder is not a Controller subclass"]),
        ("commitenv_controllers.base:Controller", ["does not implement act"]),
        ("nope_h7", ["unknown controller 'nope_h7'", "vllm", "module:Class"]),
    ],
)
def test_bad_controller_specs_are_one_clear_error(spec, fragments, files, capsys):
    spec = spec.format(dir=files.dir)
    _one_error(capsys, main(["run", str(files.scenario), "--controller", spec, "--quiet"]), *fragments)
    with pytest.raises(ValueError):
        make(spec)


def test_an_unregistered_instance_is_recorded_under_its_class_name(files):
    class Unnamed(Controller):
        def act(self, observation, info):
            return {"active": 1, "clock": 0}

    s = evaluate(Unnamed(), str(files.scenario)).summary
    assert s["controller"] == "Unnamed"  # was "base"
    assert "controller_origin" not in s  # a class defined in a function cannot be found again
    # a name the class body sets is kept; a subclass does not inherit its registered parent's name
    assert resolve(f"{files.ctl}:Labelled").name == "labelled"
    assert resolve(f"{files.ctl}:MyVLLM").name == "MyVLLM"
    assert make(f"{files.ctl}:MyVLLM").name == "MyVLLM"


# ------------------------------------------------------------------------------------------ entry points
def _fake_entry_points(monkeypatch, eps: list[SimpleNamespace]) -> None:
    import importlib.metadata

    def entry_points(**kw):
        assert kw == {"group": "commitenv.controllers"}
        return list(eps)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(registry, "_EP_ORIGINS", {})


def _ep(name: str, value: str, load, dist: str = "fake-dist") -> SimpleNamespace:
    return SimpleNamespace(name=name, value=value, group="commitenv.controllers", dist=SimpleNamespace(name=dist),
                           load=load)


@pytest.fixture
def fake_plugin(files, monkeypatch):
    monkeypatch.syspath_prepend(str(files.dir))
    import my_controllers

    def broken():
        raise ImportError("plugin needs torch")

    _fake_entry_points(monkeypatch, [
        _ep("half_pool", "my_controllers:HalfPool", lambda: my_controllers.HalfPool),
        _ep("vllm", "elsewhere:Other", lambda: pytest.fail("a registered name must not load its entry point")),
        _ep("broken_plugin", "bp:X", broken, dist="bp-dist"),
    ])
    return my_controllers


def test_make_falls_back_to_entry_points(fake_plugin, files, capsys):
    ctrl = make("half_pool", frac=1.0)
    assert isinstance(ctrl, fake_plugin.HalfPool) and ctrl.name == "half_pool"
    r = resolve("half_pool")
    assert r.origin == "entry_point:fake-dist" and r.doc.startswith("Half the pool")
    assert resolve("vllm").origin == "builtin"
    assert "half_pool" in commitenv_controllers.all_names() and "half_pool" not in commitenv_controllers.available()
    with pytest.raises(ValueError, match="broken_plugin.*bp-dist.*plugin needs torch"):
        make("broken_plugin")
    with pytest.raises(ValueError, match="unknown controller 'zzz'.*half_pool"):
        make("zzz")
    s = _run_json(capsys, ["run", str(files.scenario), "--controller", "half_pool", "--quiet"])
    assert s["controller"] == "half_pool" and s["controller_origin"] == "entry_point:fake-dist"


def test_controllers_command_lists_registered_and_entry_point_controllers(fake_plugin, capsys):
    assert main(["controllers"]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln.split(None, 2)[1:] for ln in out.splitlines() if ln.strip()}
    for name in ("vllm", "fixed_config", "epact", "static_target", "dynamollm"):
        assert lines[name][0] == "builtin"
    assert lines["vllm"][1].startswith("Latency-first baseline")
    assert lines["static_target"][1].startswith("ePACT's Static-Target ablation")
    assert lines["half_pool"] == ["entry_point:fake-dist", "Half the pool at clock level ``level``; reports a "
                                                           "planning delay of ``delay`` s."]
    assert lines["broken_plugin"][0] == "entry_point:bp-dist" and "cannot load" in lines["broken_plugin"][1]


def test_pyproject_declares_every_builtin_as_an_entry_point():
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["commitenv.controllers"]
    assert set(commitenv_controllers.available()) <= set(eps)  # what the package registers on import is declared
    for name, value in eps.items():
        r = resolve(value)  # imports the module (heavy ones, e.g. mpc with cvxpy, only now)
        assert r.name == name, (name, value)  # the class behind the declaration is the registered one
    assert sorted(eps) == commitenv_controllers.available()
    st = make("static_target")
    assert st.static_target is True and st.name == "static_target"
    st2 = resolve(eps["static_target"]).make(workers=0)
    assert st2.static_target is True and st2.name == "static_target"


def test_the_library_does_not_import_controllers_at_import_time():
    code = ("import sys, commitenv, commitenv.cli, commitenv.evaluation, commitenv.runner; "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('controllers', 'commitenv_controllers')]")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_users_controllers_folder_does_not_shadow_the_builtins(tmp_path):
    """A project folder named ``controllers/`` (a common name) on sys.path, as the working directory is for
    ``python -c``, notebooks and pytest: the built-ins live in the package ``commitenv_controllers``, so their
    entry points still load, and the user's own package stays importable under its own name."""
    user = tmp_path / "controllers"
    user.mkdir()
    (user / "__init__.py").write_text("MINE = True\n")
    code = ("import controllers; assert controllers.MINE; "
            "from commitenv.registry import make, resolve; "
            "assert type(make('vllm')).__module__ == 'commitenv_controllers.vllm'; "
            "assert resolve('epact').origin == 'builtin'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.strip() == "ok"


# ------------------------------------------------------------------------------------------ --controller-arg
def test_controller_args_are_parsed_as_json_and_checked(files, capsys):
    spec = f"{files.ctl}:HalfPool"
    base = ["run", str(files.scenario), "--controller", spec, "--quiet"]
    s = _run_json(capsys, base + ["--controller-arg", "frac=0.5", "--controller-arg", "level=0",
                                  "--controller-arg", "label=hello world", "--controller-arg", "fail_at=null"])
    assert s["controller_kwargs"] == {"frac": 0.5, "level": 0, "label": "hello world", "fail_at": None}
    s = _run_json(capsys, base + ["--controller-arg", "label=a.b=c"])
    assert s["controller_kwargs"] == {"label": "a.b=c"}  # the first '=' splits; a dot in the value is no scope
    line = _one_error(capsys, main(base + ["--controller-arg", "lvl=1"]), "unknown argument 'lvl'")
    assert "accepted: level, frac, label, delay, fail_at" in line
    _one_error(capsys, main(base + ["--controller-arg", "level=1.5"]), "'level' expects int, got 1.5")
    _one_error(capsys, main(base + ["--controller-arg", "level=true"]), "'level' expects int")
    _one_error(capsys, main(base + ["--controller-arg", "frac=half"]), "'frac' expects float, got half")
    _one_error(capsys, main(base + ["--controller-arg", "noequals"]), "KEY=VALUE")
    # built-ins: fixed_config's annotated int, static_target's signature (a factory described by a class)
    _one_error(capsys, main(["run", str(files.scenario), "--controller", "fixed_config", "--controller-arg",
                             "active=two", "--quiet"]), "'active' expects int")
    line = _one_error(capsys, main(["run", str(files.scenario), "--controller", "static_target", "--controller-arg",
                                    "static_target=false", "--quiet"]), "unknown argument 'static_target'")
    assert "workers" in line and "slo_scope" in line


def test_controller_arg_makes_fixed_config_fit_a_small_pool(files, capsys):
    s = _run_json(capsys, ["run", str(files.scenario), "--controller", "fixed_config", "--controller-arg", "active=1",
                           "--quiet"])
    assert s["controller_kwargs"] == {"active": 1} and s["controller_origin"] == "builtin"


# ------------------------------------------------------------------------------------------ compare goes on
def test_compare_goes_on_past_failing_controllers(files, tmp_path, capsys):
    out = tmp_path / "cmp"
    specs = ["fixed_config", "vllm", f"{files.ctl}:HalfPool"]  # 28 replicas do not fit the 2-GPU pool
    rc = main(["compare", str(files.scenario), "--controllers", ",".join(specs), "--controller-arg",
               "fixed_config.active=28", "--controller-arg", "HalfPool.fail_at=2", "--out", str(out), "--quiet"])
    stdout, err = capsys.readouterr()
    assert rc == 1
    doc = json.loads((out / "compare.json").read_text())
    assert [r["controller"] for r in doc["results"]] == ["vllm"]
    errors = {e["controller"]: e["error"] for e in doc["errors"]}
    assert errors == {"fixed_config": "fixed_config: active=28 outside 1..2",
                      "HalfPool": "RuntimeError: broken at interval 2"}
    assert doc["gate"] == {"fixed_config": "error", "vllm": "pass", "HalfPool": "error"}
    assert "error: fixed_config failed: fixed_config: active=28 outside 1..2" in err
    assert "HalfPool: FAILED (RuntimeError: broken at interval 2)" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "vllm"]


def test_compare_scoped_argument_must_name_a_compared_controller(files, capsys):
    _one_error(capsys, main(["compare", str(files.scenario), "--controllers", "vllm", "--controller-arg",
                             "epact.workers=0", "--quiet"]), "no controller 'epact'")


# ------------------------------------------------------------------------------------------ decisions.csv
def test_decisions_record_actions_application_times_and_planning_delays(files, tmp_path):
    env, res = ev.run_episode(f"{files.ctl}:Alternating", str(files.scenario), seed=0)
    rows = res.decisions
    assert len(rows) == env.H * env.K == 18
    assert [r["interval"] for r in rows] == list(range(18))
    assert [r["t_start_s"] for r in rows] == [600.0 * k for k in range(18)]
    assert [r["active"] for r in rows] == [1 + k % 2 for k in range(18)]
    assert {r["clock_mhz"] for r in rows} == {1000}
    assert [r["planning_delay_s"] for r in rows] == [700.0 if k == 3 else 0.0 for k in range(18)]
    assert [r["stale"] for r in rows] == [int(k == 3) for k in range(18)]
    # the env starts with both replicas at the top clock: interval 0 (1 replica) changes it, interval 1 changes
    # back, 2 again; interval 3 (2 replicas) is stale, so 1 replica stays, interval 4 (1) changes nothing and
    # interval 5 (2) changes again
    applied = {r["interval"]: r["applied_s"] for r in rows if r["applied_s"] is not None}
    assert sorted(applied) == sorted(int(t // 600) for _, t, _ in env.actions)
    assert all(applied[k] == pytest.approx(600.0 * k) for k in applied)  # no actuation delay in the toy scenario
    assert sorted(applied) == [0, 1, 2] + list(range(5, 18))
    out = res.write(tmp_path / "run", figure=False)
    table = _read_csv(out / "decisions.csv")
    assert list(table[0])[:9] == ["interval", "t_start_s", "active", "clock_mhz", "applied_s", "stale",
                                  "planning_delay_s", "reported_delay_s", "measured_s"]
    assert {"energy_j", "commitment_pace_j", "arrivals", "misses"} <= set(table[0])  # the interval's outcome (docs/cli.md)
    assert table[3]["applied_s"] == "" and table[3]["stale"] == "1" and table[3]["planning_delay_s"] == "700"
    assert table[3]["reported_delay_s"] == "700" and table[3]["measured_s"] == ""  # ideal: the report, not measured
    assert table[4]["applied_s"] == "" and table[4]["stale"] == "0" and table[4]["active"] == "1"
    assert table[5]["applied_s"] == "3000" and table[5]["active"] == "2"


# ------------------------------------------------------------------------------------------ seeds and statistics
def test_parse_seeds():
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("0,3,7") == [0, 3, 7]
    assert parse_seeds("5") == [5]
    assert parse_seeds("0-2, 10") == [0, 1, 2, 10]
    for bad, msg in [("3-1", "backwards"), ("a", "not a seed"), ("1,,2", "empty"), ("1,1", "twice"),
                     ("-1", "not a seed")]:
        with pytest.raises(ValueError, match=msg):
            parse_seeds(bad)


def test_t_quantiles_and_confidence_interval():
    # printed tables (two-sided 95 %) and the large-df expansion
    assert t975(1) == pytest.approx(12.7062, abs=1e-4)
    assert t975(4) == pytest.approx(2.7764, abs=1e-4)
    assert t975(9) == pytest.approx(2.2622, abs=1e-4)
    assert t975(29) == pytest.approx(2.0452, abs=1e-4)
    assert t975(40) == pytest.approx(2.0211, abs=1e-4)
    assert t975(120) == pytest.approx(1.9799, abs=1e-4)
    assert t975(10**6) == pytest.approx(1.95996, abs=1e-5)
    assert all(t975(d) > t975(d + 1) for d in range(1, 200))
    try:
        from scipy.stats import t as student
    except ImportError:
        pass
    else:
        for df in range(1, 300):
            assert t975(df) == pytest.approx(student.ppf(0.975, df), abs=6e-5), df
    with pytest.raises(ValueError):
        t975(0)
    x = [1.0, 2.0, 3.0, 4.0]
    m = mean_ci95(x)
    sd = math.sqrt(sum((v - 2.5) ** 2 for v in x) / 3)
    assert m["n"] == 4 and m["mean"] == 2.5 and m["sd"] == pytest.approx(sd)
    assert m["half_width"] == pytest.approx(3.1824 * sd / 2, rel=1e-12)
    assert m["ci95"] == pytest.approx([2.5 - m["half_width"], 2.5 + m["half_width"]])
    assert mean_ci95([7.0]) == {"n": 1, "mean": 7.0, "sd": None, "half_width": None, "ci95": None}


def test_many_seeds_parallel_equals_serial_and_resumes(files, tmp_path, capsys, monkeypatch):
    specs = f"vllm,{files.ctl}:HalfPool"
    argv = ["compare", str(files.scenario), "--controllers", specs, "--seeds", "0-2", "--quiet"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(argv + ["--jobs", "2", "--out", str(a)]) == 0, capsys.readouterr().err
    assert main(argv + ["--jobs", "1", "--out", str(b)]) == 0, capsys.readouterr().err
    da, db = (json.loads((d / "compare.json").read_text()) for d in (a, b))
    assert _per_seed(da) == _per_seed(db)
    for name in ("vllm", "HalfPool"):
        for s in range(3):
            ea, eb = a / name / f"seed-{s}", b / name / f"seed-{s}"
            assert sorted(p.name for p in ea.iterdir()) == ["decisions.csv", "hourly.csv", "overview.png",
                                                            "summary.json"]
            for f in ("decisions.csv", "hourly.csv"):
                assert (ea / f).read_bytes() == (eb / f).read_bytes()
            summ = json.loads((ea / "summary.json").read_text())
            assert summ["seed"] == s and summ["controller"] == name
    assert not [p for p in a.rglob(".*")]  # no temporary files or folders left

    # the aggregate: mean, t interval, per-seed values, gate count
    c = {x["controller"]: x for x in da["controllers"]}
    assert da["seeds"] == [0, 1, 2] and da["errors"] == []
    e = c["vllm"]["metrics"]["energy_mj"]
    vals = [json.loads((a / "vllm" / f"seed-{s}" / "summary.json").read_text())["energy_mj"] for s in range(3)]
    assert e["per_seed"] == {str(s): v for s, v in enumerate(vals)}
    assert e["mean"] == pytest.approx(np.mean(vals))
    assert e["half_width"] == pytest.approx(t975(2) * np.std(vals, ddof=1) / math.sqrt(3))
    assert c["vllm"]["slo_gate_pass_count"] == 3 and c["HalfPool"]["origin"].startswith("path:")
    assert c["HalfPool"]["metrics"]["half_frac"]["mean"] == 0.5  # stats() entries are aggregated too
    rows = _read_csv(a / "compare.csv")
    row = next(r for r in rows if r["controller"] == "vllm" and r["metric"] == "energy_mj")
    assert float(row["mean"]) == pytest.approx(e["mean"]) and float(row["seed_2"]) == pytest.approx(vals[2])
    assert float(row["ci95_low"]) == pytest.approx(e["ci95"][0])
    gate_row = next(r for r in rows if r["controller"] == "vllm" and r["metric"] == "slo_gate_pass")
    assert gate_row["mean"] == "1.0" and gate_row["seed_0"] == "1"

    # a second invocation with the same OUT runs nothing; one more seed runs just that seed
    calls = []
    real = ev.run_episode

    def spy(*a_, **k_):
        calls.append((a_[0], a_[2]))
        return real(*a_, **k_)

    monkeypatch.setattr(ev, "run_episode", spy)
    mtimes = {p: p.stat().st_mtime_ns for p in a.rglob("summary.json")}
    assert main(argv + ["--jobs", "1", "--out", str(a)]) == 0
    assert calls == [] and "resuming: 6 of 6 episodes" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in a.rglob("summary.json")} == mtimes
    assert main(["compare", str(files.scenario), "--controllers", specs, "--seeds", "0-3", "--quiet",
                 "--out", str(a)]) == 0
    # the new seed's episodes, and its two reference runs for the score (seeds 0-2's are cached)
    assert sorted(calls) == sorted([("vllm", 3), (f"{files.ctl}:HalfPool", 3), ("vllm", 3), ("oracle", 3)])
    assert json.loads((a / "compare.json").read_text())["controllers"][0]["episodes"] == 4
    # other arguments are another episode: run again, as is everything with --rerun
    calls.clear()
    assert main(["run", str(files.scenario), "--controller", f"{files.ctl}:HalfPool", "--controller-arg", "frac=1",
                 "--seeds", "0,1", "--quiet", "--out", str(a)]) == 0
    assert sorted(calls) == [(f"{files.ctl}:HalfPool", 0), (f"{files.ctl}:HalfPool", 1)]
    assert json.loads((a / "HalfPool" / "seed-0" / "summary.json").read_text())["controller_kwargs"] == {"frac": 1}
    calls.clear()
    assert main(["run", str(files.scenario), "--controller", "vllm", "--seeds", "0", "--rerun", "--quiet",
                 "--out", str(a)]) == 0
    assert calls == [("vllm", 0)]
    capsys.readouterr()


def test_many_seeds_record_failing_episodes_and_go_on(files, tmp_path, capsys):
    out = tmp_path / "m"
    rc = main(["compare", str(files.scenario), "--controllers", "fixed_config,vllm", "--controller-arg",
               "fixed_config.active=28", "--seeds", "0,1", "--out", str(out), "--quiet"])
    stdout, err = capsys.readouterr()
    assert rc == 1
    doc = json.loads((out / "compare.json").read_text())
    assert doc["errors"] == [{"controller": "fixed_config", "seed": s, "error": "fixed_config: active=28 outside 1..2"}
                             for s in (0, 1)]
    c = {x["controller"]: x for x in doc["controllers"]}
    assert c["fixed_config"]["episodes"] == 0 and c["fixed_config"]["failed_seeds"] == [0, 1]
    assert c["vllm"]["episodes"] == 2 and sorted(c["vllm"]["metrics"]["energy_mj"]["per_seed"]) == ["0", "1"]
    assert "error: fixed_config seed 0 failed" in err and "fixed_config seed 1: FAILED" in stdout


@pytest.mark.parametrize("argv, fragment", [
    (["--seeds", "1-0"], "backwards"),
    (["--seeds", "0-1", "--jobs", "0"], "--jobs"),
    (["--jobs", "2"], "only with --seeds"),
])
def test_seed_option_errors(argv, fragment, files, capsys):
    _one_error(capsys, main(["run", str(files.scenario), "--quiet", *argv]), fragment)


def test_seeds_from_the_scenarios_declared_ranges():
    from commitenv.runner import scenario_seeds
    from commitenv.scenarios import load_scenario
    from commitenv.scenarios.schema import SeedRanges

    r = SeedRanges(train=(0, 50), test=(50, 53))
    assert scenario_seeds("test", r) == [50, 51, 52]
    assert scenario_seeds("train:4", r) == [0, 1, 2, 3]
    assert scenario_seeds("0-4", r) is None  # not a range name: parsed as a list
    with pytest.raises(ValueError, match="holds 3 seeds, asked for 5"):
        scenario_seeds("test:5", r)
    with pytest.raises(ValueError, match="declares no seed ranges"):
        scenario_seeds("test", None)
    bench = load_scenario("bench-h200-hour-fixed-a30")
    assert scenario_seeds("test:2", bench.seeds) == [100000, 100001]


def test_readme_plugin_module_runs_from_its_project_folder(tmp_path):
    """README's "Write a controller" module, saved as my_pkg/ctl.py in a project folder that is not
    installed: `commitenv run --controller my_pkg.ctl:HalfPool` finds it from that folder (as ``python -m`` would),
    with its typed argument validated and recorded."""
    import re

    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme[readme.index("## Write a controller"):], re.S).group(1)
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "ctl.py").write_text(code)
    script = Path(sys.executable).with_name("commitenv")  # the console script: the working directory is not on
    if not script.exists():  # its sys.path (unlike python -c), so this exercises the project-folder lookup
        pytest.skip("the commitenv console script is not installed beside this interpreter")
    cli = [str(script), "run", "bench-h200-hour-fixed-a30", "--controller", "my_pkg.ctl:HalfPool", "--quiet"]
    ok = subprocess.run(cli + ["--controller-arg", "share=0.75", "--out", str(tmp_path / "out")], cwd=tmp_path,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["controller"] == "HalfPool" and s["controller_kwargs"] == {"share": 0.75}
    assert s["controller_origin"] == "module:my_pkg.ctl:HalfPool"
    bad = subprocess.run(cli + ["--controller-arg", "mode=fast"], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 2 and "argument 'mode' expects one of 'slack', 'fixed', got fast" in bad.stderr
