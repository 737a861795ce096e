"""Run a submission's controller in its own process: the env stays here, the controller gets messages.

`SandboxedController` is a `commitenv.control.Controller` whose ``act`` forwards the observation and info to a
fresh interpreter (`commitenv.leaderboard._child`, started with ``python -I`` and a scrubbed environment, never
forked from this process's memory) and answers its requests for the sanctioned snapshot view. It enforces per
decision a CPU budget and a wall time, per episode a wall time, and a memory cap (the child's address-space limit
and a resident-set watchdog here); it charges the CPU the child spent on a decision as its planning delay (or the
delay the child reported, if larger). Any breach, crash or malformed action raises `SandboxFailure` with a status and
a reason; `run_sandboxed` then scores the episode as the do-nothing baseline.
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from commitenv.control import Controller, ControllerContext
from commitenv.leaderboard.submission import Submission, sandbox_spec
from commitenv.leaderboard.suite import Episode, Limits
from commitenv.leaderboard.wire import WireError, recv_json, send_pickle

log = logging.getLogger(__name__)
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class SandboxFailure(Exception):
    """An episode the submission lost: ``status`` is crash, timeout, cpu_budget, memory or invalid_action."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status, self.reason = status, reason


class SubmissionRefused(Exception):
    """The submission cannot be scored at all (a hindsight controller)."""


def read_roots() -> tuple[str, ...]:
    """What a sandboxed controller may read: the Python installation, the commitenv packages (with the shipped
    scenarios and profiles, which are public)."""
    import commitenv
    import commitenv_controllers
    from commitenv._paths import data_dir

    paths = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {str(Path(commitenv.__file__).parent), str(Path(commitenv_controllers.__file__).parent)}
    for kind in ("scenarios", "profiles"):
        try:
            paths.add(str(data_dir(kind)))
        except FileNotFoundError:
            pass
    paths |= {str(Path(sys.base_prefix) / "lib"), str(Path(sys.prefix) / "lib")}
    return tuple(sorted(p for p in paths if p))


def _proc_stat(pid: int) -> tuple[float, int]:
    """(CPU seconds, resident bytes) of process ``pid``, threads included, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0
    return (int(fields[11]) + int(fields[12])) / _TICK, int(fields[21]) * _PAGE


class SandboxedController(Controller):
    """The host's stand-in for a submission's controller (see the module docstring)."""

    def __init__(self, submission: Submission, limits: Limits, denied: tuple[str, ...] = (),
                 controller_seed: int | None = None) -> None:
        self.submission, self.limits, self.denied = submission, limits, tuple(str(d) for d in denied)
        self.controller_seed = controller_seed  # forwarded instead of the env's (a secret suite's own stream)
        self.name = submission.name
        self._proc: subprocess.Popen | None = None
        self._root: Path | None = None
        self._to = self._from = -1
        self._cpu: list[float] = []
        self._child_stats: dict[str, float] = {}
        self._t_episode = 0.0
        self._k = 0

    # ------------------------------------------------------------------------------------------ lifecycle
    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        self._t_episode = time.monotonic()
        lim = self.limits
        try:
            self._start()
            ready = self._serve({"ready", "refused"}, wall_s=lim.startup_s, cpu_s=lim.startup_s, what="start-up")
            if ready["op"] == "refused":
                raise SubmissionRefused(str(ready.get("reason", "refused")))
            fwd = seed if self.controller_seed is None else self.controller_seed
            self._send(("reset", replace(ctx, probe=None, hindsight=None), fwd))
            self._serve({"reset_done"}, wall_s=lim.startup_s, cpu_s=lim.startup_s, what="reset")
        except BaseException:
            self._kill()  # run_episode closes a controller only once its reset succeeded
            raise

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        lim = self.limits
        left = lim.wall_s_per_episode - (time.monotonic() - self._t_episode)
        if left <= 0:
            self._fail("timeout", f"the episode's wall time limit of {lim.wall_s_per_episode:g} s is used up")
        cpu0 = _proc_stat(self._proc.pid)[0]
        self._send(("act", observation, info))
        msg = self._serve({"action"}, wall_s=min(lim.wall_s_per_decision, left), cpu_s=lim.cpu_s_per_decision,
                          what=f"decision {self._k}", cpu0=cpu0)
        cpu = max(0.0, _proc_stat(self._proc.pid)[0] - cpu0)
        action = self._check_action(msg.get("action"))
        reported = msg.get("reported_delay_s", 0.0)
        reported = float(reported) if isinstance(reported, (int, float)) and math.isfinite(reported) else 0.0
        self._cpu.append(cpu)
        self.ctx.probe.report_planning_delay(max(cpu, reported, 0.0))
        self._k += 1
        return action

    def close(self) -> None:
        try:
            if self._proc is not None and self._proc.poll() is None:
                try:
                    self._send(("close",))
                    msg = self._serve({"stats"}, wall_s=10.0, cpu_s=10.0, what="close")
                    self._child_stats = {k: float(v) for k, v in (msg.get("stats") or {}).items()
                                         if isinstance(v, (int, float)) and not isinstance(v, bool)
                                         and math.isfinite(v)}
                except SandboxFailure as e:  # the episode's numbers stand; its close is only logged
                    log.warning("%s: close: %s", self.name, e)
        finally:
            self._kill()

    def stats(self) -> dict[str, float]:
        cpu = self._cpu or [0.0]
        return {**self._child_stats, "sandbox_cpu_s_mean": float(np.mean(cpu)), "sandbox_cpu_s_max": float(max(cpu)),
                "sandbox_decisions": float(len(self._cpu))}

    # ------------------------------------------------------------------------------------------ the child
    def _start(self) -> None:
        root = Path(tempfile.mkdtemp(prefix="commitenv-sandbox-"))
        self._root = root
        sub = self.submission
        dest = root / "submission"
        dest.mkdir()
        for rel in sub.files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(sub.folder / rel, dest / rel)
        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        spec = {"in_fd": r_in, "out_fd": w_out, "root": str(root), "memory_mb": self.limits.memory_mb,
                "controller": sandbox_spec(sub, root), "kwargs": dict(sub.meta.kwargs),
                "read_roots": list(read_roots()), "denied": list(self.denied)}
        env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "TMPDIR": str(root), "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "NUMBA_NUM_THREADS": "1", "MPLCONFIGDIR": str(root), "PYTHONHASHSEED": "0",
               "PYTHONDONTWRITEBYTECODE": "1"}
        log_fh = open(root / "child.log", "wb")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-m", "commitenv.leaderboard._child", json.dumps(spec)],
                cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                pass_fds=(r_in, w_out), close_fds=True, start_new_session=True)
        finally:
            log_fh.close()
            os.close(r_in)
            os.close(w_out)
        self._to, self._from = w_in, r_out

    def _send(self, msg: tuple) -> None:
        try:
            send_pickle(self._to, msg)
        except OSError as e:
            self._fail("crash", f"the controller's process is gone ({e.strerror or e}){self._log_tail()}")

    def _serve(self, until: set[str], *, wall_s: float, cpu_s: float, what: str,
               cpu0: float | None = None) -> dict[str, Any]:
        """Answer the child's requests until it sends one of ``until``; enforce the limits meanwhile."""
        proc = self._proc
        t0 = time.monotonic()
        if cpu0 is None:
            cpu0 = _proc_stat(proc.pid)[0]
        mem_cap = self.limits.memory_mb << 20
        while True:
            ready, _, _ = select.select([self._from], [], [], 0.05)
            cpu, rss = _proc_stat(proc.pid)
            if rss > mem_cap:
                self._fail("memory", f"{what}: resident memory {rss >> 20} MiB over the limit of "
                                     f"{self.limits.memory_mb} MiB")
            if cpu - cpu0 > cpu_s:
                self._fail("cpu_budget", f"{what}: used {cpu - cpu0:.1f} s of CPU, over the budget of {cpu_s:g} s")
            if time.monotonic() - t0 > wall_s:
                self._fail("timeout", f"{what}: no answer within {wall_s:g} s of wall time")
            if not ready:
                if proc.poll() is not None:
                    self._fail("crash", f"{what}: the controller's process exited with code {proc.returncode}"
                                        f"{self._log_tail()}")
                continue
            try:
                msg = recv_json(self._from)
            except WireError as e:
                try:
                    code = proc.wait(timeout=2.0)
                    why = f"the controller's process exited with code {code}"
                except subprocess.TimeoutExpired:
                    why = str(e)
                self._fail("crash", f"{what}: {why}{self._log_tail()}")
            op = msg["op"]
            if op in until:
                return msg
            if op == "error":
                kind = "memory" if msg.get("kind") == "memory" else "crash"
                tb = str(msg.get("traceback", "")).strip().splitlines()
                self._fail(kind, f"{what} ({msg.get('stage')}): {msg.get('error')}"
                                 + (f" [{tb[-2].strip()}]" if len(tb) >= 2 else ""))
            self._answer(msg, what)

    def _answer(self, msg: dict[str, Any], what: str) -> None:
        op = msg["op"]
        probe = self.ctx.probe
        try:
            if op == "snapshot":
                payload = probe.snapshot()
            elif op == "recent_arrivals":
                w = msg.get("window_s")
                if not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                    raise ValueError(f"recent_arrivals: window_s must be a finite number >= 0, got {w!r}")
                payload = probe.recent_arrivals(float(w))
            else:
                self._fail("crash", f"{what}: unexpected message '{op}'")
        except (ValueError, RuntimeError) as e:
            self._send(("error", str(e)))
            return
        self._send(("reply", payload))

    def _check_action(self, action: Any) -> dict[str, int]:
        """The env action, checked here so that a malformed one is the submission's loss, not a host error."""
        ctx = self.ctx
        if not isinstance(action, dict) or set(action) != {"active", "clock"}:
            self._fail("invalid_action", f"decision {self._k}: expected {{'active': int, 'clock': int}}, got "
                                         f"{str(action)[:200]}")
        a, c = action["active"], action["clock"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (a, c)):
            self._fail("invalid_action", f"decision {self._k}: active and clock must be whole numbers, got "
                                         f"{a!r}, {c!r}")
        if not 1 <= a <= ctx.n_replicas or not 0 <= c < len(ctx.clocks_mhz):
            self._fail("invalid_action", f"decision {self._k}: active {a} (expected 1..{ctx.n_replicas}), clock "
                                         f"index {c} (expected 0..{len(ctx.clocks_mhz) - 1})")
        return {"active": a, "clock": c}

    def _log_tail(self) -> str:
        try:
            text = (self._root / "child.log").read_text(errors="replace").strip()
        except (OSError, TypeError):
            return ""
        return f"; its output ends: {text[-500:]}" if text else ""

    def _fail(self, status: str, reason: str) -> None:
        self._kill()
        raise SandboxFailure(status, reason)

    def _kill(self) -> None:
        """Stop the child (its whole process group) and remove its folder."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    proc.kill()
            proc.wait()
        for fd in (self._to, self._from):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._to = self._from = -1
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None


# ============================================================================================== episodes
class DoNothing(Controller):
    """The baseline a lost episode is scored as: one replica at the lowest clock, every interval."""

    name = "do_nothing"

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        return self.ctx.action(1, self.ctx.clocks_mhz[0])


def episode_scenario(ep: Episode):
    """The episode's scenario, its commitments scaled by ``ep.commitment_scale`` (fractions capped at 2; an
    energy-only scenario has no commitment to scale, so it takes only the scale 1)."""
    from commitenv.scenarios.loader import load_scenario

    sc = load_scenario(ep.scenario)
    if sc.commitment.energy_only and ep.commitment_scale != 1.0:
        raise ValueError(f"episode {ep.scenario}: commitment_scale {ep.commitment_scale}: an energy-only scenario "
                         "has no commitment to scale (expected 1.0)")
    if ep.commitment_scale == 1.0:
        return sc
    c = sc.commitment
    if c.fractions is not None:
        upd = {"fractions": [min(2.0, f * ep.commitment_scale) for f in c.fractions]}
    else:
        upd = {"mj": [v * ep.commitment_scale for v in c.mj]}
    out = sc.model_copy(update={"commitment": c.model_copy(update=upd)})
    return load_scenario(out)


@dataclass(frozen=True)
class SandboxJob:
    """One scored episode of a submission (what the runner's workers receive)."""

    submission: Submission
    episode: Episode
    limits: Limits
    denied: tuple[str, ...] = ()
    controller_seed: int | None = None


def run_sandboxed(job: SandboxJob) -> dict[str, Any]:
    """Run one episode of the submission in the sandbox: ``{"status": "ok", "summary": ...}``; on a loss
    ``{"status": <why>, "reason": ..., "summary": <the do-nothing baseline's summary>}``; ``{"refused": reason}``
    when the submission cannot be scored."""
    from commitenv.evaluation import run_episode

    sc = episode_scenario(job.episode)
    ctrl = SandboxedController(job.submission, job.limits, job.denied, job.controller_seed)
    t0 = time.perf_counter()
    try:
        _, res = run_episode(ctrl, sc, job.episode.seed)
        return {"status": "ok", "reason": None, "summary": res.summary, "wall_s": time.perf_counter() - t0}
    except SubmissionRefused as e:
        return {"refused": str(e)}
    except SandboxFailure as e:
        log.warning("%s, %s: %s; scored as the do-nothing baseline", job.submission.name, job.episode.label, e)
        _, res = run_episode(DoNothing(), sc, job.episode.seed)
        return {"status": e.status, "reason": e.reason, "summary": res.summary, "wall_s": time.perf_counter() - t0}
