"""The leaderboard sandbox attacked: a submission runs in its own interpreter and must not reach the trace, the
secret, the host's memory or the engine's truth; crashes, hangs, memory hogs and bad actions lose the episode, which
then scores as the do-nothing baseline with the reason recorded."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from commitenv.evaluation import run_episode
from commitenv.leaderboard.sandbox import DoNothing, SandboxedController, SandboxJob, run_sandboxed
from commitenv.leaderboard.submission import load_submission
from commitenv.leaderboard.suite import Episode, Limits
from helpers.scenarios import toy_three_hour, write_scenario

# wall limits far above the CPU ones: a CPU-bound decision meets its CPU budget before its wall limit even with a
# twentieth of a core (a loaded machine); the cases about the wall limit set a short one of their own (CASE_LIMITS)
LIMITS = Limits(cpu_s_per_decision=3, wall_s_per_decision=60, wall_s_per_episode=300, memory_mb=1536, startup_s=60)
CASE_LIMITS = {"Spin": LIMITS.model_copy(update={"cpu_s_per_decision": 1}),
               "Hang": LIMITS.model_copy(update={"wall_s_per_decision": 5})}
HEADER = """
import numpy as np
from commitenv.control import Controller

class Served(Controller):
    '''vLLM's action: every replica at the reference clock.'''
    def act(self, observation, info):
        return self.ctx.action(self.ctx.n_replicas, self.ctx.reference_clock_mhz)
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """A one-hour toy scenario (2 GPUs, 6 intervals of 600 s, a trace file)."""
    return toy_three_hour(tmp_path_factory.mktemp("lb") / "sc", horizon_hours=1, commitment={"mj": [0.2]},
                          name="toy-one")


def submission(tmp: Path, body: str, cls: str, **kwargs):
    folder = tmp / f"sub-{cls}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "controller.py").write_text(HEADER + textwrap.dedent(body))
    (folder / "submission.yaml").write_text(yaml.safe_dump({
        "name": cls.lower(), "authors": ["test"], "controller": f"controller.py:{cls}", "kwargs": kwargs}))
    return load_submission(folder)


def sandboxed(sub, scenario, seed=0, limits=LIMITS, denied=()):
    return run_sandboxed(SandboxJob(sub, Episode(str(scenario), seed), limits, tuple(str(d) for d in denied)))


def _same_run(a: dict, b: dict) -> bool:
    keys = ("cost_kwh_eq", "energy_mj", "attainment_pct", "misses")
    return all(a[k] == b[k] for k in keys)


# ================================================================================================ faithful
def test_a_sandboxed_controller_runs_as_it_does_in_process(tmp_path, toy):
    sub = submission(tmp_path, "", "Served")
    out = sandboxed(sub, toy)
    assert out["status"] == "ok" and out["reason"] is None
    _, ref = run_episode("vllm", toy, 0)  # the same action every interval, so the charged CPU delay changes nothing
    assert _same_run(out["summary"], ref.summary)
    assert out["summary"]["sandbox_decisions"] == 6


def test_relative_paths_in_kwargs_name_the_submissions_own_files(tmp_path, toy):
    """The copied folder is the child's working directory: a controller told ``path: data/active.txt`` reads its own
    file there and acts on it (1 of 2 replicas), as Fixed-Config with one replica does in-process."""
    body = """
    class FromFile(Controller):
        def __init__(self, path):
            with open(path) as fh:
                self.active = int(fh.read())
        def act(self, observation, info):
            return self.ctx.action(self.active, self.ctx.reference_clock_mhz)
    """
    sub_dir = tmp_path / "sub-FromFile"
    (sub_dir / "data").mkdir(parents=True)
    (sub_dir / "data" / "active.txt").write_text("1\n")
    sub = submission(tmp_path, body, "FromFile", path="data/active.txt")
    out = sandboxed(sub, toy)
    assert out["status"] == "ok", out["reason"]
    _, ref = run_episode("fixed_config", toy, 0, controller_kwargs={"active": 1})
    served = run_episode("vllm", toy, 0)[1].summary["energy_mj"]
    assert ref.summary["energy_mj"] < 0.9 * served  # (one replica, not two: the second GPU's floor for the hour)
    if out["summary"]["planning_delay_s_max"] == 0.0:  # (the child's CPU, charged, rounds to 0 at 0.1 s resolution)
        assert _same_run(out["summary"], ref.summary)
    else:  # (a loaded machine: the first decision's CPU charged, the switch to one replica a step later)
        assert out["summary"]["energy_mj"] == pytest.approx(ref.summary["energy_mj"], rel=1e-3)


def test_planning_cpu_is_measured_by_the_host_and_charged_as_delay(tmp_path, toy):
    """The child burns about 1 s of CPU in decision 2 and reports a delay of 0: the host charges what it measured."""
    body = """
    import time
    class Burn(Controller):
        def act(self, observation, info):
            if info["interval"] == 2:
                self.ctx.probe.report_planning_delay(0.0)
                t = time.process_time()
                while time.process_time() - t < 1.0:
                    pass
            return self.ctx.action(1 if info["interval"] >= 2 else self.ctx.n_replicas, self.ctx.reference_clock_mhz)
    """
    sub = submission(tmp_path, body, "Burn")
    ctrl = SandboxedController(sub, LIMITS)
    _, res = run_episode(ctrl, toy, 0)
    delays = [d["planning_delay_s"] for d in res.decisions]
    assert 0.9 <= delays[2] <= 3.0, delays
    assert max(delays[:2] + delays[3:]) < 0.5, delays
    assert res.decisions[2]["applied_s"] >= res.decisions[2]["t_start_s"] + delays[2]


# ================================================================================================ no road to the truth
def test_reading_the_trace_file_is_refused(tmp_path, toy):
    trace = toy.parent / "toy3.csv"
    body = f"""
    class ReadTrace(Served):
        def reset(self, ctx, seed=None):
            super().reset(ctx, seed)
            self.got = 0
            for path in ({str(trace)!r}, {str(toy)!r}):
                try:
                    open(path).read()
                    self.got += 1
                except PermissionError:
                    pass
        def stats(self):
            return {{"files_read": self.got}}
    """
    out = sandboxed(submission(tmp_path, body, "ReadTrace"), toy)
    assert out["status"] == "ok"
    assert out["summary"]["files_read"] == 0


def test_the_secret_is_neither_in_the_environment_nor_readable(tmp_path, toy, monkeypatch):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    monkeypatch.setenv("COMMITENV_LEADERBOARD_SECRET", "hunter2")
    body = f"""
    import os
    class Secret(Served):
        def reset(self, ctx, seed=None):
            super().reset(ctx, seed)
            self.env_hits = sum("hunter2" in v for v in os.environ.values())
            self.file_hits = 0
            try:
                self.file_hits = int("hunter2" in open({str(secret)!r}).read())
            except PermissionError:
                pass
        def stats(self):
            return {{"env_hits": self.env_hits, "file_hits": self.file_hits}}
    """
    out = sandboxed(submission(tmp_path, body, "Secret"), toy, denied=(secret,))
    assert out["status"] == "ok"
    assert out["summary"]["env_hits"] == 0 and out["summary"]["file_hits"] == 0


def test_the_host_process_is_out_of_reach(tmp_path, toy):
    """gc finds no environment in the child; /proc of the host, processes, sockets and ctypes calls are refused."""
    escape = tmp_path / "escaped.txt"
    body = """
    import gc, os, socket, subprocess
    class Reach(Served):
        def reset(self, ctx, seed=None):
            super().reset(ctx, seed)
            self.hits = {"envs": sum(type(o).__name__ in ("CommitServeEnv", "Pool", "RequestTable")
                                     for o in gc.get_objects())}
            attempts = {
                "host_mem": lambda: open(f"/proc/{os.getppid()}/mem", "rb"),
                "host_environ": lambda: open(f"/proc/{os.getppid()}/environ", "rb").read(),
                "subprocess": lambda: subprocess.run(["cat", "/etc/hostname"]),
                "system": lambda: os.system("true"),
                "socket": lambda: socket.create_connection(("127.0.0.1", 22), timeout=1),
                "fork": lambda: os.fork(),
                "write_outside": lambda: open(ESCAPE, "w"),
                "kill_host": lambda: os.kill(os.getppid(), 0),
            }
            for name, attempt in attempts.items():
                try:
                    attempt()
                    self.hits[name] = 1
                except PermissionError:
                    self.hits[name] = 0
                except OSError:
                    self.hits[name] = 0
        def stats(self):
            return self.hits
    """
    out = sandboxed(submission(tmp_path, body.replace("ESCAPE", repr(str(escape))), "Reach"), toy)
    assert out["status"] == "ok", out["reason"]
    s = out["summary"]
    for k in ("envs", "host_mem", "host_environ", "subprocess", "system", "socket", "fork", "write_outside",
              "kill_host"):
        assert s[k] == 0, k
    assert not escape.exists()


def test_a_snapshot_sent_to_the_sandbox_holds_no_truth(tmp_path, toy):
    """Snapshots arrive at each decision time, and nothing in the child's memory afterwards is a trace table or a
    truth model (the snapshot's own tests, tests/sim/test_snapshot_view.py, check its contents)."""
    body = """
    class Look(Served):
        def reset(self, ctx, seed=None):
            super().reset(ctx, seed)
            self.times, self.types = [], set()
        def act(self, observation, info):
            snap = self.ctx.probe.snapshot()
            self.times.append(snap.t)
            import gc
            self.types |= {type(o).__name__ for o in gc.get_objects() if type(o).__name__ in ("RequestTable", "Truth")}
            return super().act(observation, info)
        def stats(self):
            return {"at_boundaries": float(self.times == [600.0 * k for k in range(6)]), "tables": len(self.types)}
    """
    out = sandboxed(submission(tmp_path, body, "Look"), toy)
    assert out["status"] == "ok", out["reason"]
    assert out["summary"]["at_boundaries"] == 1 and out["summary"]["tables"] == 0


# ================================================================================================ losses
@pytest.mark.parametrize("cls, body, status, says", [
    ("Crash", """
    class Crash(Served):
        def act(self, observation, info):
            if info["interval"] == 3:
                raise RuntimeError("boom at 3")
            return super().act(observation, info)
    """, "crash", "boom at 3"),
    ("Spin", """
    class Spin(Served):
        def act(self, observation, info):
            while info["interval"] == 1:
                pass
            return super().act(observation, info)
    """, "cpu_budget", "decision 1"),
    ("Hang", """
    import time
    class Hang(Served):
        def act(self, observation, info):
            if info["interval"] == 1:
                time.sleep(60)
            return super().act(observation, info)
    """, "timeout", "decision 1"),
    ("Hog", """
    class Hog(Served):
        def act(self, observation, info):
            self.block = np.ones((4 << 30) // 8)
            return super().act(observation, info)
    """, "memory", "MemoryError"),
    ("Bad", """
    class Bad(Served):
        def act(self, observation, info):
            return {"active": self.ctx.n_replicas + 1, "clock": 0}
    """, "invalid_action", "active 3"),
    ("Extra", """
    class Extra(Served):
        def act(self, observation, info):
            return {**super().act(observation, info), "sm_share": 1}
    """, "invalid_action", "expected"),
    ("Frac", """
    class Frac(Served):
        def act(self, observation, info):
            return {"active": 1.5, "clock": 0}
    """, "invalid_action", "whole numbers"),
    ("Routes", """
    from commitenv.sim.dispatch import LeastUnfinished
    class Routes(Served):
        def dispatch_policy(self):
            return LeastUnfinished()
    """, "crash", "dispatch policy (Controller.dispatch_policy)"),
    ("Exit", """
    import os
    class Exit(Served):
        def act(self, observation, info):
            os._exit(7)
    """, "crash", "code 7"),
])
def test_a_lost_episode_scores_as_do_nothing_with_its_reason(tmp_path, toy, cls, body, status, says):
    out = sandboxed(submission(tmp_path, body, cls), toy, limits=CASE_LIMITS.get(cls, LIMITS))
    assert out["status"] == status, out
    assert says in out["reason"]
    _, nothing = run_episode(DoNothing(), toy, 0)
    assert _same_run(out["summary"], nothing.summary)


def test_a_hindsight_controller_is_refused(tmp_path, toy):
    body = """
    class Peek(Served):
        hindsight = True
    """
    out = sandboxed(submission(tmp_path, body, "Peek"), toy)
    assert "refused" in out and "hindsight" in out["refused"]


def test_the_workload_cannot_be_rebuilt_from_a_secret_seed(tmp_path):
    """The attack works where seeds are public (it finds the run seed among the scenario's declared test seeds from
    the first interval's arrivals), and finds nothing for a seed drawn from a secret suite's range."""
    sc = write_scenario(tmp_path / "sc", "rebuild", pool={"profile": "h200-qwen3.8-27b-fp8", "gpus": 2},
                        workload={"builtin": "azure-code-day", "seed": None, "start_hour": 12, "rate_scale": 0.004,
                                  "rate_spread": 0.1},
                        horizon_hours=1, commitment={"fractions": [0.85], "reference": {"workload_seed": 0}},
                        seeds={"train": [0, 100], "test": [100, 130]})
    body = """
    from pathlib import Path
    import numpy as np
    class Rebuild(Served):
        def __init__(self, scenario_yaml: str):
            self.text = scenario_yaml
        def reset(self, ctx, seed=None):
            super().reset(ctx, seed)
            self.found, self.tried = -1, 0
        def act(self, observation, info):
            if info["interval"] == 1 and self.found == -1:
                from commitenv.scenarios import load_scenario, scenario_workload
                Path("rebuild.yaml").write_text(self.text)
                sc = load_scenario("rebuild.yaml")
                seen = self.ctx.probe.recent_arrivals(600.0).arrival_s - 600.0
                lo, hi = sc.seeds.test
                for s in range(lo, hi):
                    self.tried += 1
                    cand = scenario_workload(sc, s).arrival_s[: len(seen)]
                    if len(cand) == len(seen) and np.allclose(cand, seen, rtol=0, atol=1e-9):
                        self.found = s
            return super().act(observation, info)
        def stats(self):
            return {"found": self.found, "tried": self.tried}
    """
    sub = submission(tmp_path, body, "Rebuild", scenario_yaml=sc.read_text())
    public = sandboxed(sub, sc, seed=117)
    assert public["status"] == "ok", public["reason"]
    assert public["summary"]["found"] == 117  # the attack is real
    hidden = sandboxed(sub, sc, seed=1_234_567_891)
    assert hidden["status"] == "ok", hidden["reason"]
    assert hidden["summary"]["tried"] == 30 and hidden["summary"]["found"] == -1


def test_bubblewraps_report_is_read_to_its_end_when_written_in_parts(tmp_path, monkeypatch):
    """bubblewrap writes its --info-fd report in several writes: a read between two writes must wait for the rest,
    not fail the submission as "did not report" (it did on a loaded CI machine)."""
    import os

    from commitenv.leaderboard import sandbox as sb

    sub = submission(tmp_path, "", "Served")
    ctrl = SandboxedController(sub, LIMITS)
    ctrl._proc = object()  # a started child (only its presence is read here)
    monkeypatch.setattr(sb.iso, "app_pid", lambda ns_init: ns_init + 1)
    r, w = os.pipe()
    ctrl._info = r
    os.write(w, b'{\n    "child-pid": 4242')
    assert ctrl._find_pid() is None  # half a report: nothing known yet, and no failure
    os.write(w, b',\n    "pid-namespace": 4026532175\n}\n')
    assert ctrl._find_pid() is None  # the whole report, but the pipe is still open
    os.close(w)
    assert ctrl._find_pid() == 4243
    assert ctrl._info == -1
