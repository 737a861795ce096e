"""The Ray backend of many-seed runs (``--seeds ... --ray [ADDRESS]``): the same per-seed results as one process,
resumable, failures recorded; Ray started (and stopped) only when asked for; a clear error without Ray. The
scheduling is checked against a stand-in ``ray`` module, the episodes on a real local Ray (skipped without it)."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

import commitenv.runner as runner
from commitenv.cli import main
from commitenv.runner import Job, run_jobs
from helpers.scenarios import toy_three_hour
from helpers.summaries import per_seed as _per_seed

CONTROLLER = '''
from commitenv_controllers import Controller


class Half(Controller):
    """Half the pool at the top clock."""

    def act(self, observation, info):
        return {"active": max(1, self.ctx.n_replicas // 2), "clock": 1}
'''

EPISODE_FILES = ["decisions.csv", "hourly.csv", "overview.png", "summary.json"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("ray")
    ctl = d / "half.py"
    ctl.write_text(CONTROLLER)
    return SimpleNamespace(scenario=toy_three_hour(d / "sc"), ctl=ctl)


def _argv(files, *more: str) -> list[str]:
    return ["compare", str(files.scenario), "--controllers", f"vllm,{files.ctl}:Half", "--seeds", "0-1", "--quiet",
            *more]


def _error_lines(capsys, rc: int) -> list[str]:
    out, err = capsys.readouterr()
    assert rc == 2 and "Traceback" not in out + err
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


# ------------------------------------------------------------------------------------------ without Ray
def test_missing_ray_is_a_clear_error_before_any_run(files, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as when it is not installed
    rc = main(_argv(files, "--ray", "--out", str(tmp_path / "o")))
    (line,) = _error_lines(capsys, rc)
    assert line.startswith("""error: --ray needs the 'ray' extra: pip install "commitenv[ray]" (""")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["run", "SC", "--ray"], "--ray: only with --seeds"),
    (["compare", "--seeds", "0-1", "--ray", "SC"], "toy-three.yaml: not a Ray address"),
    (["compare", "SC", "--seeds", "0-1", "--ray", "--jobs", "0"], "--jobs: expected at least 1 episode at a time"),
])
def test_ray_option_errors(argv, fragment, files, capsys):
    argv = [str(files.scenario) if a == "SC" else a for a in argv]
    (line,) = _error_lines(capsys, main(argv + ["--quiet"]))
    assert fragment in line


class FakeRay:
    """Just enough of ``ray`` for `run_jobs`: tasks run when fetched, the latest submitted finishes first."""

    def __init__(self) -> None:
        self.initialized, self.inits, self.shutdowns, self.options = False, [], 0, None
        self.waiting: dict[object, tuple] = {}
        self.most_in_flight = 0

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **kw) -> None:
        self.initialized = True
        self.inits.append(kw)

    def shutdown(self) -> None:
        self.initialized = False
        self.shutdowns += 1

    def cluster_resources(self) -> dict:
        return {"CPU": 2.0}

    def remote(self, **options):
        self.options = options
        return lambda fn: SimpleNamespace(remote=lambda job: self._submit(fn, job))

    def _submit(self, fn, job) -> object:
        ref = object()
        self.waiting[ref] = (fn, job)
        self.most_in_flight = max(self.most_in_flight, len(self.waiting))
        return ref

    def wait(self, refs: list, num_returns: int = 1) -> tuple[list, list]:
        return refs[-1:], refs[:-1]

    def get(self, ref):
        fn, job = self.waiting.pop(ref)
        if job.seed == 3:
            raise RuntimeError("worker died")
        return fn(job)


def test_ray_scheduling_in_flight_order_errors_and_shutdown(monkeypatch):
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setenv("COMMITENV_CACHE", "/somewhere/cache")
    monkeypatch.setattr(runner, "run_job_shipped", lambda job: {"summary": {"seed": job.seed}})
    jobs = [Job("vllm", "vllm", None, {}, "toy", s) for s in range(5)]
    seen: list[int] = []
    res = run_jobs(jobs, n_jobs=2, ray_address="local", on_done=lambda job, r: seen.append(job.seed))
    assert res[:3] + res[4:] == [{"summary": {"seed": s}} for s in (0, 1, 2, 4)]
    assert res[3] == {"error": "RuntimeError: worker died"}
    assert sorted(seen) == list(range(5)) and seen != list(range(5))  # handled as they finish
    assert fake.most_in_flight == 2
    assert fake.inits == [{"address": "local", "include_dashboard": False, "log_to_driver": False,
                           "ignore_reinit_error": True, "num_cpus": 2}]
    assert fake.options == {"num_cpus": 1, "runtime_env": {"env_vars": {"COMMITENV_CACHE": "/somewhere/cache"}}}
    assert fake.shutdowns == 1 and not fake.initialized

    # a cluster address, every job in flight; Ray initialized by the caller is used and left running (the address
    # is probed before Ray is asked to connect: tests/site/test_site_runner.py tries one that does not answer)
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    probed: list[str] = []
    monkeypatch.setattr(runner, "_check_answers", probed.append)
    run_jobs(jobs, n_jobs=None, ray_address="ray://head:10001")
    assert probed == ["ray://head:10001"]
    assert fake.most_in_flight == 5 and "num_cpus" not in fake.inits[0] and fake.shutdowns == 1
    fake.initialized = True
    run_jobs(jobs, ray_address="auto")
    assert len(fake.inits) == 1 and fake.shutdowns == 1 and fake.initialized


# ------------------------------------------------------------------------------------------ a real local Ray
@pytest.fixture(scope="module")
def ray_session():
    """One local Ray (2 CPUs) for the tests that use it; `commitenv` finds it initialized and leaves it running."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never a running cluster
    yield ray
    ray.shutdown()


def test_ray_local_run_equals_one_process(files, tmp_path, capsys):
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    a, b = tmp_path / "ray", tmp_path / "one"
    assert main(_argv(files, "--ray", "--jobs", "2", "--out", str(a))) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "ray: a local Ray with 2 CPUs" in err
    assert not ray.is_initialized()  # started for the command, so stopped after it
    assert main(_argv(files, "--jobs", "1", "--out", str(b))) == 0, capsys.readouterr().err
    da, db = (json.loads((d / "compare.json").read_text()) for d in (a, b))
    assert _per_seed(da) == _per_seed(db) and da["errors"] == []
    for name in ("vllm", "Half"):
        for s in (0, 1):
            ea, eb = a / name / f"seed-{s}", b / name / f"seed-{s}"
            assert sorted(p.name for p in ea.iterdir()) == EPISODE_FILES  # written here, from the worker's files
            for f in ("decisions.csv", "hourly.csv"):
                assert (ea / f).read_bytes() == (eb / f).read_bytes()
            sa, sb = (json.loads((e / "summary.json").read_text()) for e in (ea, eb))
            assert {k: v for k, v in sa.items() if k != "wall_s"} == {k: v for k, v in sb.items() if k != "wall_s"}
    assert not [p for p in a.rglob(".*")]  # no temporary files left


def test_ray_resumes_and_records_failures(ray_session, files, tmp_path, capsys):
    out = tmp_path / "m"
    argv = ["compare", str(files.scenario), "--controllers", "fixed_config,vllm", "--controller-arg",
            "fixed_config.active=28", "--seeds", "0-1", "--quiet", "--ray", "--out", str(out)]
    assert main(argv) == 1
    stdout, err = capsys.readouterr()
    doc = json.loads((out / "compare.json").read_text())
    assert doc["errors"] == [{"controller": "fixed_config", "seed": s, "error": "fixed_config: active=28 outside 1..2"}
                             for s in (0, 1)]
    assert "error: fixed_config seed 0 failed" in err and "fixed_config seed 1: FAILED" in stdout
    assert "ray: using the Ray already initialized" in err
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")}
    assert len(mtimes) == 2

    # again: the finished episodes are kept, the failed ones run again (and fail again)
    assert main(argv) == 1
    assert "resuming: 2 of 4 episodes already finished" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("summary.json")} == mtimes
    assert json.loads((out / "compare.json").read_text())["controllers"][1]["episodes"] == 2
    assert ray_session.is_initialized()  # not ours to stop
