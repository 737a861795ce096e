"""Run a submission's controller in its own sandboxed process: the env stays here, the controller gets messages.

`SandboxedController` is a `commitenv.control.Controller` whose ``act`` forwards the observation and info to a
fresh interpreter (`commitenv.leaderboard._child`, started with ``python -I`` and a scrubbed environment, never
forked from this process's memory) and answers its requests for the sanctioned snapshot view.

Two isolations (``isolation``): ``kernel`` (the boundary; `commitenv.leaderboard.isolation`) starts the child under
bubblewrap in its own user, pid, mount and network namespaces over a read-only minimal root, and the child loads a
seccomp filter (`commitenv.leaderboard.seccomp_policy`) and hard resource limits before the submission's code runs;
``process`` (where the kernel refuses namespaces: public suites only) starts it as a plain process with the
resource limits. In both the child keeps a Python audit hook as a second layer.

The host enforces per decision a CPU budget and a wall time, per episode a wall time, and a memory cap (the child's
address-space limit and a resident-set watchdog here). It charges as each decision's planning delay all the CPU
the child's threads spent since the previous decision was charged (so work done between decisions, in a
background thread, is charged to the next one), or the delay the child reported, if larger. It reads at most
`wire.MAX_REPLY` bytes of a reply (JSON only, its nesting bounded) and only the tail of the child's log. Any
breach, crash or malformed action raises `SandboxFailure` with a status and a reason; `run_sandboxed` then scores
the episode as the do-nothing baseline. `validate_submission` builds the controller once in the sandbox before any
episode, so a submission that does not load is refused at once.
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
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from commitenv.control import Controller, ControllerContext
from commitenv.leaderboard import boxes
from commitenv.leaderboard import isolation as iso
from commitenv.leaderboard.submission import Submission, sandbox_spec
from commitenv.leaderboard.suite import Episode, Limits
from commitenv.leaderboard.wire import WireError, recv_json, send_pickle
from commitenv.sim.compile import export_cache

log = logging.getLogger(__name__)
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
ENGINE_CACHE = ".numba-cache"  # the box's copy of the compiled what-if engine (`commitenv.sim.compile.export_cache`)
LOG_TAIL = 2048  # bytes of the child's log the host reads (its end only)
FILE_MB = 64  # the child's RLIMIT_FSIZE: its log and any file it writes
OPEN_FILES = 256  # the child's RLIMIT_NOFILE
ISOLATIONS = ("kernel", "process")


class SandboxFailure(Exception):
    """An episode the submission lost: ``status`` is crash, timeout, cpu_budget, memory or invalid_action."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status, self.reason = status, reason


class SubmissionRefused(Exception):
    """The submission cannot be scored at all (a hindsight controller)."""


class SubmissionInvalid(ValueError):
    """The submission does not load in the sandbox (a missing file or class, a syntax error, bad arguments, not a
    Controller): refused before any episode is scored."""


class SandboxUnavailable(ValueError):
    """The kernel boundary is needed (a secret suite, or asked for) and this machine cannot build it."""


def resolve_isolation(isolation: str = "auto", *, secret: bool = False) -> str:
    """``kernel`` where the machine can build the boundary; else ``process`` (with a warning) for a public suite,
    and `SandboxUnavailable` for a secret one, which is never scored unprotected."""
    if isolation not in ("auto", *ISOLATIONS):
        raise ValueError(f"isolation: expected auto, kernel or process, got {isolation!r}")
    ok, why = iso.boundary()
    if secret and (isolation == "process" or not ok):
        raise SandboxUnavailable("a secret suite is scored only behind the kernel boundary (namespaces, seccomp), "
                                 + (f"and this machine cannot build it: {why}" if not ok else "not with --isolation "
                                                                                               "process"))
    if isolation == "kernel" and not ok:
        raise SandboxUnavailable(f"the kernel sandbox is not available: {why}")
    if isolation == "auto":
        if ok:
            return "kernel"
        log.warning("the kernel sandbox is not available (%s): the submission runs as a plain process behind Python's "
                    "audit hook, which is not a security boundary; public suites only", why)
        return "process"
    return isolation


def read_roots() -> tuple[str, ...]:
    """What the audit hook lets a sandboxed controller read: the Python installation, the commitenv packages (with
    the shipped scenarios and profiles, which are public)."""
    paths = iso.package_paths()
    paths |= {str(Path(sys.base_prefix) / "lib"), str(Path(sys.prefix) / "lib")}
    return tuple(sorted(p for p in paths if p))


def _proc_stat(pid: int | None) -> tuple[float, int]:
    """(CPU seconds, resident bytes) of process ``pid``, all its threads, from /proc (0, 0 when gone)."""
    if pid is None:
        return 0.0, 0
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0
    return (int(fields[11]) + int(fields[12])) / _TICK, int(fields[21]) * _PAGE


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else " " for c in text)


class SandboxedController(Controller):
    """The host's stand-in for a submission's controller (see the module docstring)."""

    def __init__(self, submission: Submission, limits: Limits, denied: tuple[str, ...] = (),
                 controller_seed: int | None = None, isolation: str = "auto") -> None:
        self.submission, self.limits, self.denied = submission, limits, tuple(str(d) for d in denied)
        self.controller_seed = controller_seed  # forwarded instead of the env's (a secret suite's own stream)
        self.isolation = resolve_isolation(isolation)
        self.name = submission.name
        self._proc: subprocess.Popen | None = None
        self._dir: Path | None = None  # the host's folder: box/ (the child's) and child.log
        self._to = self._from = self._info = -1
        self._info_buf = b""
        self._ns_init: int | None = None  # bubblewrap's init in the new pid namespace (host pid)
        self._pid: int | None = None  # the child interpreter (host pid)
        self._cpu: list[float] = []
        self._charged = 0.0  # the child's CPU seconds up to the last charge
        self._child_stats: dict[str, float] = {}
        self._t_episode = 0.0
        self._k = 0

    # ------------------------------------------------------------------------------------------ lifecycle
    def reset(self, ctx: ControllerContext, seed: int | None = None) -> None:
        super().reset(ctx, seed)
        self._t_episode = time.monotonic()
        lim = self.limits
        try:
            self.start()
            fwd = seed if self.controller_seed is None else self.controller_seed
            self._send(("reset", replace(ctx, probe=None, hindsight=None), fwd))
            self._serve({"reset_done"}, wall_s=lim.startup_s, cpu_s=lim.startup_s, what="reset")
            self._charged = self._cpu_now()
        except BaseException:
            self._kill()  # run_episode closes a controller only once its reset succeeded
            raise

    def start(self) -> dict[str, Any]:
        """Start the child and wait until it has built the controller (its ``ready`` message); SubmissionRefused
        for a hindsight controller, SandboxFailure when it does not load."""
        lim = self.limits
        self._start()
        ready = self._serve({"ready", "refused"}, wall_s=lim.startup_s, cpu_s=lim.startup_s, what="start-up")
        if ready["op"] == "refused":
            raise SubmissionRefused(str(ready.get("reason", "refused"))[:500])
        if self.isolation == "kernel" and ready.get("seccomp") is not True:
            self._fail("crash", "start-up: the child did not confirm its seccomp filter")
        if self._find_pid() is None:  # the host's problem, not the submission's: its CPU could not be charged
            self._kill()
            raise RuntimeError("the sandboxed process cannot be found in /proc to measure its CPU time")
        return ready

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        lim = self.limits
        left = lim.wall_s_per_episode - (time.monotonic() - self._t_episode)
        if left <= 0:
            self._fail("timeout", f"the episode's wall time limit of {lim.wall_s_per_episode:g} s is used up")
        cpu0 = self._charged  # what the child spent since the last charge (between decisions too) counts here
        self._send(("act", observation, info))
        # the first decision carries one-time work a warm deployment would have done before (lazy imports, the JIT
        # compilation of the what-if engine in a fresh process): it may use the start-up budget; it is charged all
        cpu_budget = max(lim.cpu_s_per_decision, lim.startup_s) if self._k == 0 else lim.cpu_s_per_decision
        wall_budget = max(lim.wall_s_per_decision, lim.startup_s) if self._k == 0 else lim.wall_s_per_decision
        msg = self._serve({"action"}, wall_s=min(wall_budget, left), cpu_s=cpu_budget,
                          what=f"decision {self._k}", cpu0=cpu0)
        now = self._cpu_now()
        cpu = max(0.0, now - cpu0)
        self._charged = max(now, cpu0)
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
                    stats = msg.get("stats")
                    self._child_stats = {str(k)[:64]: float(v) for k, v in list((stats or {}).items())[:64]
                                         if isinstance(v, (int, float)) and not isinstance(v, bool)
                                         and math.isfinite(v)} if isinstance(stats, dict) else {}
                    self._child_stats["sandbox_cpu_s_after_last_decision"] = max(0.0, self._cpu_now() - self._charged)
                except SandboxFailure as e:  # the episode's numbers stand; its close is only logged
                    log.warning("%s: close: %s", self.name, e)
        finally:
            self._kill()

    def stats(self) -> dict[str, float]:
        cpu = self._cpu or [0.0]
        return {**self._child_stats, "sandbox_cpu_s_mean": float(np.mean(cpu)), "sandbox_cpu_s_max": float(max(cpu)),
                "sandbox_decisions": float(len(self._cpu))}

    # ------------------------------------------------------------------------------------------ the child
    def _rlimits(self) -> dict[str, int]:
        lim = self.limits
        return {"as": lim.memory_mb << 20, "cpu": math.ceil(lim.startup_s + lim.wall_s_per_episode),
                "fsize": FILE_MB << 20, "nofile": OPEN_FILES}

    def _start(self) -> None:
        self._dir = boxes.new_box()
        box = self._dir / "box"
        kernel = self.isolation == "kernel"
        root = iso.BOX if kernel else str(box)
        sub = self.submission
        dest = box / "submission"
        dest.mkdir()
        for rel in sub.files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(sub.folder / rel, dest / rel)
        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        fds = [r_in, w_out]
        spec = {"in_fd": r_in, "out_fd": w_out, "root": root, "rlimits": self._rlimits(), "seccomp": kernel,
                "controller": sandbox_spec(sub, Path(root)), "kwargs": dict(sub.meta.kwargs),
                "read_roots": list(read_roots()), "denied": list(self.denied)}
        env = {"PATH": "/usr/bin:/bin", "HOME": root, "TMPDIR": "/tmp" if kernel else root, "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "NUMBA_NUM_THREADS": "1", "MPLCONFIGDIR": root, "PYTHONHASHSEED": "0",
               "PYTHONDONTWRITEBYTECODE": "1"}
        # the what-if engine compiled ahead: a copy of the host's numba cache in the box (the child's own; numba
        # refuses a read-only cache folder, and nothing the child writes there reaches the host's cache)
        try:
            copied = export_cache(box / ENGINE_CACHE)
        except Exception as e:  # noqa: BLE001  (the child then compiles for itself, as without a cache)
            log.warning("the compiled engine could not be copied into the sandbox (%s: %s)", type(e).__name__, e)
            copied = 0
        if copied:
            env["NUMBA_CACHE_DIR"] = f"{root}/{ENGINE_CACHE}"
        argv = [sys.executable, "-I", "-m", "commitenv.leaderboard._child", json.dumps(spec)]
        r_info = w_info = -1
        if kernel:
            r_info, w_info = os.pipe()
            fds.append(w_info)
            argv = iso.bwrap_argv(box, argv, denied=self.denied, info_fd=w_info)
        try:
            with open(self._dir / "child.log", "wb") as log_fh:  # the child's stdout and stderr (it keeps its copy)
                self._proc = subprocess.Popen(argv, cwd=box, env=env, stdin=subprocess.DEVNULL, stdout=log_fh,
                                              stderr=subprocess.STDOUT, pass_fds=tuple(fds), close_fds=True,
                                              start_new_session=True)
        finally:
            for fd in fds:
                os.close(fd)
        self._to, self._from, self._info = w_in, r_out, r_info
        self._info_buf = b""
        if not kernel:
            self._pid = self._proc.pid

    def _find_pid(self) -> int | None:
        """The child interpreter's host pid (under bubblewrap: read from its ``--info-fd`` report, then /proc)."""
        if self._pid is not None or self._proc is None:
            return self._pid
        if self._ns_init is None and self._info >= 0:
            # bubblewrap writes its report in several writes and then closes the pipe: read to the end, never
            # parse a part of it (a read between two writes gave "did not report" under load)
            while select.select([self._info], [], [], 0)[0]:
                chunk = os.read(self._info, 4096)
                if chunk:
                    self._info_buf += chunk
                    continue
                os.close(self._info)
                self._info = -1
                try:
                    self._ns_init = int(json.loads(self._info_buf)["child-pid"])
                except (ValueError, KeyError, TypeError):
                    self._fail("crash", "start-up: bubblewrap did not report the sandbox's process "
                                        f"(it wrote {self._info_buf[:200]!r}){self._log_tail()}")
                break
        if self._ns_init is not None:
            self._pid = iso.app_pid(self._ns_init)
        return self._pid

    def _cpu_now(self) -> float:
        return _proc_stat(self._find_pid())[0]

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
            cpu0 = self._cpu_now()
        mem_cap = self.limits.memory_mb << 20
        while True:
            ready, _, _ = select.select([self._from], [], [], 0.05)
            cpu, rss = _proc_stat(self._find_pid())
            if rss > mem_cap:
                self._fail("memory", f"{what}: resident memory {rss >> 20} MiB over the limit of "
                                     f"{self.limits.memory_mb} MiB")
            if cpu - cpu0 > cpu_s:
                self._fail("cpu_budget", f"{what}: used {cpu - cpu0:.1f} s of CPU, over the budget of {cpu_s:g} s")
            if time.monotonic() - t0 > wall_s:
                self._fail("timeout", f"{what}: no answer within {wall_s:g} s of wall time")
            if not ready:
                if proc.poll() is not None:
                    self._fail("crash", f"{what}: the controller's process exited with {self._exit_text()}"
                                        f"{self._log_tail()}")
                continue
            try:
                msg = recv_json(self._from)
            except WireError as e:
                why = f"a malformed message: {e}"
                if e.closed:  # most likely it is exiting: say how
                    try:
                        proc.wait(timeout=2.0)
                        why = f"the controller's process exited with {self._exit_text()}"
                    except subprocess.TimeoutExpired:
                        why = str(e)
                self._fail("crash", f"{what}: {why}{self._log_tail()}")
            op = msg["op"]
            if op in until:
                return msg
            if op == "error":
                log.debug("%s: the child's traceback:\n%s", self.name, str(msg.get("traceback", ""))[:4000])
                kind = "memory" if msg.get("kind") == "memory" else "crash"
                tb = [ln for ln in str(msg.get("traceback", "")).strip().splitlines()
                      if set(ln.strip()) - set("^~ ")]  # not the caret lines under a source line
                self._fail(kind, _printable(f"{what} ({str(msg.get('stage'))[:20]}): {str(msg.get('error'))[:2000]}"
                                            + (f" [{tb[-2].strip()[:500]}]" if len(tb) >= 2 else "")))
            self._answer(msg, what)

    def _exit_text(self) -> str:
        """How the child ended: ``code N`` (bubblewrap passes its exit status on) or ``signal NAME``."""
        code = self._proc.returncode if self._proc is not None else None
        if code is not None and code < 0:
            try:
                return f"signal {signal.Signals(-code).name}"
            except ValueError:
                return f"signal {-code}"
        if code is not None and code > 128 and self.isolation == "kernel":
            try:
                return f"code {code} (signal {signal.Signals(code - 128).name})"
            except ValueError:
                pass
        return f"code {code}"

    def _answer(self, msg: dict[str, Any], what: str) -> None:
        op = msg["op"]
        probe = self.ctx.probe if self.ctx is not None else None
        try:
            if probe is None:
                self._fail("crash", f"{what}: asked for '{str(op)[:40]}' before the episode started")
            if op == "snapshot":
                payload = probe.snapshot()
            elif op == "recent_arrivals":
                w = msg.get("window_s")
                if not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w) or w < 0:
                    raise ValueError(f"recent_arrivals: window_s must be a finite number >= 0, got {str(w)[:40]}")
                payload = probe.recent_arrivals(float(w))
            else:
                self._fail("crash", f"{what}: unexpected message '{_printable(str(op)[:40])}'")
        except (ValueError, RuntimeError) as e:
            self._send(("error", str(e)))
            return
        self._send(("reply", payload))

    def _check_action(self, action: Any) -> dict[str, int]:
        """The env action, checked here so that a malformed one is the submission's loss, not a host error."""
        ctx = self.ctx
        if not isinstance(action, dict) or set(action) != {"active", "clock"}:
            self._fail("invalid_action", f"decision {self._k}: expected {{'active': int, 'clock': int}}, got "
                                         f"{_printable(str(action)[:200])}")
        a, c = action["active"], action["clock"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (a, c)):
            self._fail("invalid_action", f"decision {self._k}: active and clock must be whole numbers, got "
                                         f"{_printable(repr(a)[:40])}, {_printable(repr(c)[:40])}")
        if not 1 <= a <= ctx.n_replicas or not 0 <= c < len(ctx.clocks_mhz):
            self._fail("invalid_action", f"decision {self._k}: active {a} (expected 1..{ctx.n_replicas}), clock "
                                         f"index {c} (expected 0..{len(ctx.clocks_mhz) - 1})")
        return {"active": a, "clock": c}

    def _log_tail(self) -> str:
        """The end of the child's output (at most `LOG_TAIL` bytes read, 500 characters kept)."""
        if self._dir is None:
            return ""
        try:
            with open(self._dir / "child.log", "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - LOG_TAIL))
                text = fh.read(LOG_TAIL).decode(errors="replace").strip()
        except OSError:
            return ""
        return f"; its output ends: {_printable(text[-500:])}" if text else ""

    def _fail(self, status: str, reason: str) -> None:
        reason = reason + ("" if "its output ends" in reason or status not in ("crash", "memory")
                           else self._log_tail())
        self._kill()
        raise SandboxFailure(status, reason)

    def _kill(self) -> None:
        """Stop the child (bubblewrap's whole pid namespace, or the process group) and remove its folder."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                for pid in (self._pid if self.isolation == "kernel" else None, self._ns_init):
                    if pid is not None:
                        try:
                            os.kill(pid, signal.SIGKILL)  # the namespace's init dying takes every process in it
                        except OSError:
                            pass
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    proc.kill()
            proc.wait()
        for fd in (self._to, self._from, self._info):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._to = self._from = self._info = -1
        self._pid = self._ns_init = None
        if self._dir is not None:
            boxes.remove(self._dir)
            self._dir = None


def validate_submission(sub: Submission, limits: Limits, denied: tuple[str, ...] = (), isolation: str = "auto"
                        ) -> str | None:
    """Build the submission's controller once in the sandbox, before anything is scored: None when it loads, the
    reason when it is refused (a hindsight controller); `SubmissionInvalid` with the child's one-line error when it
    does not load (a missing file or class, a syntax error, bad arguments, not a Controller)."""
    ctrl = SandboxedController(sub, limits, denied, isolation=isolation)
    try:
        ctrl.start()
        return None
    except SubmissionRefused as e:
        return str(e)
    except SandboxFailure as e:
        raise SubmissionInvalid(f"submission {sub.name} does not load: {e.reason}") from None
    finally:
        ctrl._kill()


# ============================================================================================== episodes
class DoNothing(Controller):
    """The baseline a lost episode is scored as: one replica at the lowest clock, every interval."""

    name = "do_nothing"

    def act(self, observation: np.ndarray, info: dict[str, Any]) -> dict[str, int]:
        return self.ctx.action(1, self.ctx.clocks_mhz[0])


def episode_scenario(ep: Episode):
    """The episode's scenario, its commitments scaled by ``ep.commitment_scale`` (`scaled_commitment`)."""
    from commitenv.scenarios.loader import scaled_commitment

    return scaled_commitment(ep.scenario, ep.commitment_scale)


@dataclass(frozen=True)
class SandboxJob:
    """One scored episode of a submission (what the runner's workers receive)."""

    submission: Submission
    episode: Episode
    limits: Limits
    denied: tuple[str, ...] = ()
    controller_seed: int | None = None
    isolation: str = "auto"


def run_sandboxed(job: SandboxJob) -> dict[str, Any]:
    """Run one episode of the submission in the sandbox: ``{"status": "ok", "summary": ...}``; on a loss
    ``{"status": <why>, "reason": ..., "summary": <the do-nothing baseline's summary>}``; ``{"refused": reason}``
    when the submission cannot be scored."""
    from commitenv.evaluation import run_episode

    sc = episode_scenario(job.episode)
    ctrl = SandboxedController(job.submission, job.limits, job.denied, job.controller_seed, job.isolation)
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
