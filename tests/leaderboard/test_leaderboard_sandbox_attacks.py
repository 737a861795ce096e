"""The leaderboard sandbox attacked as issue 34's attacker did, with ordinary Python: each test fails if its attack
succeeds. Most attacks first switch the Python audit hook off (it is a second layer, not the boundary), so what
stops them is the kernel: namespaces, the read-only minimal root, the empty network, seccomp and rlimits. Where the
kernel refuses namespaces these tests are skipped with the reason; ``test_the_hook_can_be_switched_off`` shows the
switch-off is real (it reads the trace in a plain process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from helpers.scenarios import toy_three_hour

from commitenv.control import Controller
from commitenv.evaluation import run_episode
from commitenv.leaderboard import boxes
from commitenv.leaderboard import isolation as iso
from commitenv.leaderboard.sandbox import (
    DoNothing,
    SandboxedController,
    SandboxJob,
    SandboxUnavailable,
    SubmissionInvalid,
    resolve_isolation,
    run_sandboxed,
    validate_submission,
)
from commitenv.leaderboard.submission import load_submission
from commitenv.leaderboard.submit import redact
from commitenv.leaderboard.suite import Episode, Limits
from commitenv.leaderboard.wire import MAX_DEPTH, json_depth

KERNEL, WHY_NOT = iso.boundary()
needs_kernel = pytest.mark.skipif(not KERNEL, reason=f"the kernel sandbox is not available here: {WHY_NOT}")
# wall limits far above the CPU ones: a loaded machine stretches wall time, not CPU time
LIMITS = Limits(cpu_s_per_decision=3, wall_s_per_decision=60, wall_s_per_episode=300, memory_mb=1536, startup_s=60)
SECRET = "hunter2-issue34"

HEADER = '''
import gc, os, sys
from commitenv.control import Controller

def hook_off():
    """Make the sandbox's audit hook a no-op: swap its code for an empty one with the same closure."""
    hook = next(f for f in gc.get_objects() if type(f).__name__ == "function" and f.__name__ == "hook"
                and f.__module__ == "__main__")
    names = hook.__code__.co_freevars
    src = ("def outer():\\n" + "".join(f"    {n} = None\\n" for n in names) + "    def hook(event, args):\\n        "
           + (", ".join(names) or "pass") + "\\n        return None\\n    return hook\\n")
    ns = {}
    exec(src, ns)
    hook.__code__ = ns["outer"]().__code__

def attempt(fn):
    """1 when ``fn`` ran without an error, 0 when it was refused."""
    try:
        fn()
        return 1
    except BaseException:
        return 0

class Attack(Controller):
    """Runs ``attack()`` (a dict of numbers: each 1 is an escape) once, at reset, with the hook off."""
    def reset(self, ctx, seed=None):
        super().reset(ctx, seed)
        hook_off()
        self.hits = {k: float(v) for k, v in self.attack().items()}
    def act(self, observation, info):
        return self.ctx.action(self.ctx.n_replicas, self.ctx.reference_clock_mhz)
    def stats(self):
        return self.hits
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """A one-hour toy scenario (2 GPUs, 6 intervals of 600 s) with its trace file beside it."""
    return toy_three_hour(tmp_path_factory.mktemp("attack") / "sc", horizon_hours=1, commitment={"mj": [0.2]},
                          name="toy-one")


def submission(tmp: Path, body: str, cls: str = "A", tag: str = "", **kwargs):
    folder = tmp / f"sub-{cls}{tag}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ctl.py").write_text(HEADER + textwrap.dedent(body))
    (folder / "submission.yaml").write_text(yaml.safe_dump({"name": cls.lower(), "authors": ["attacker"],
                                                            "controller": f"ctl.py:{cls}", "kwargs": kwargs}))
    return load_submission(folder)


def attack(tmp: Path, toy: Path, body: str, isolation: str = "kernel", denied=(), tag: str = "") -> dict:
    """Run the attack (a class ``A(Attack)``) for one episode; its summary, the run being ok."""
    sub = submission(tmp, body, tag=tag)
    out = run_sandboxed(SandboxJob(sub, Episode(str(toy), 0), LIMITS, tuple(str(d) for d in denied), None, isolation))
    assert out["status"] == "ok", out["reason"]
    return out["summary"]


def my_boxes() -> list[Path]:
    return [d for d in boxes.parent().iterdir() if d.name.startswith(f"{os.getpid()}.")]


@pytest.fixture(autouse=True)
def no_box_left_behind():
    """Every test here must leave no sandbox folder of this process behind, however its child ended."""
    yield
    assert my_boxes() == []


# ================================================================================================ the boundary itself
@needs_kernel
def test_the_child_runs_in_namespaces_with_seccomp_and_hard_limits(tmp_path, toy):
    body = """
    import resource
    class A(Attack):
        def attack(self):
            status = dict(l.split(":\\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\\t" in l)
            lim = {n: resource.getrlimit(getattr(resource, "RLIMIT_" + n)) for n in ("AS", "CPU", "FSIZE", "NOFILE")}
            return {"pid": os.getpid(), "uid": os.getuid(), "seccomp": int(status["Seccomp"]),
                    "nnp": int(status["NoNewPrivs"]), "capeff": int(status["CapEff"], 16),
                    "as_mb": lim["AS"][1] >> 20, "fsize_mb": lim["FSIZE"][1] >> 20, "nofile": lim["NOFILE"][1],
                    "soft_is_hard": float(all(s == h for s, h in lim.values())), "cpu": lim["CPU"][1]}
    """
    s = attack(tmp_path, toy, body)
    assert s["pid"] == 2 and s["uid"] == iso.NOBODY  # pid namespace (bubblewrap's init is 1), user namespace
    assert s["seccomp"] == 2 and s["nnp"] == 1 and s["capeff"] == 0
    assert s["as_mb"] == 1536 and s["fsize_mb"] == 64 and s["nofile"] == 256 and s["soft_is_hard"] == 1
    assert s["cpu"] == LIMITS.startup_s + LIMITS.wall_s_per_episode


def test_the_hook_can_be_switched_off(tmp_path, toy):
    """Without the kernel boundary (a plain process) the switched-off hook lets the trace be read: the attack the
    other tests make is real."""
    trace = toy.parent / "toy3.csv"
    body = f"""
    class A(Attack):
        def attack(self):
            return {{"read": attempt(lambda: open({str(trace)!r}).read())}}
    """
    assert attack(tmp_path, toy, body, isolation="process")["read"] == 1


# ================================================================================================ files
@needs_kernel
@pytest.mark.parametrize("way", ["hook_code", "realpath"])
def test_the_trace_the_board_and_outside_folders_are_out_of_reach(tmp_path, toy, way):
    """With the hook off (two ways), neither the trace nor the board can be read, listed or written, by path or
    through a ``dir_fd`` relative to /; the root holds only the public minimal tree."""
    board = tmp_path / "board"
    (board / "results").mkdir(parents=True)
    row = board / "results" / "dev.jsonl"
    row.write_text('{"name": "honest"}\n')
    trace = toy.parent / "toy3.csv"
    # the minimal tree, plus the first folder of each declared public root (where this checkout's Python lives)
    allowed = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "tmp", "sandbox"}
    allowed |= {Path(p).parts[1] for p in iso._public_roots() if len(Path(p).parts) > 1}
    off = ("hook_off()" if way == "hook_code"
           else "import os.path; os.path.realpath = lambda p, *a, **k: '/sandbox/x'")
    body = f"""
    class A(Attack):
        def reset(self, ctx, seed=None):
            Controller.reset(self, ctx, seed)
            {off}
            self.hits = {{k: float(v) for k, v in self.attack().items()}}
        def attack(self):
            root = os.open("/", os.O_RDONLY)
            rel = {str(row)!r}.lstrip("/")
            def forge():
                fd = os.open(rel, os.O_WRONLY | os.O_APPEND, dir_fd=root)
                os.write(fd, b'{{"name": "forged", "score": {{"mean": 999}}}}\\n')
            top = set(os.listdir("/"))
            here = set(os.listdir({str(Path.cwd().resolve())!r})) if os.path.isdir({str(Path.cwd().resolve())!r}) else set()
            return {{"trace": attempt(lambda: open({str(trace)!r}).read()),
                    "trace_dirfd": attempt(lambda: os.open({str(trace)!r}.lstrip("/"), os.O_RDONLY, dir_fd=root)),
                    "forge": attempt(forge), "board_list": attempt(lambda: os.listdir({str(board)!r})),
                    "stat": attempt(lambda: os.stat({str(trace)!r})),
                    **{{"top_extra:" + name: 1 for name in top - set({sorted(allowed)!r})}},
                    "repo_leaderboard": float("leaderboard" in here or "tests" in here),
                    "write_usr": attempt(lambda: open("/usr/pwned", "w")),
                    "write_pkg": attempt(lambda: open(os.path.join(os.path.dirname(os.__file__), "pwned.py"), "w"))}}
    """
    s = attack(tmp_path, toy, body, denied=(board,), tag=way)
    for k in ("trace", "trace_dirfd", "forge", "board_list", "stat", "repo_leaderboard", "write_usr", "write_pkg"):
        assert s[k] == 0, k
    assert [k for k in s if k.startswith("top_extra:")] == []
    assert row.read_text() == '{"name": "honest"}\n'


# ================================================================================================ the secret
@needs_kernel
def test_no_process_the_child_can_see_holds_the_secret(tmp_path, toy, monkeypatch):
    """The host holds the secret in its environment; the child, hook off, reads the environment, command line and
    memory of every process it can see (its parent included, as ``/proc/<ppid>/mem`` and ctypes would) and finds
    nothing; the host's own pid is not among them."""
    monkeypatch.setenv("COMMITENV_LEADERBOARD_SECRET", SECRET)
    body = f"""
    import re
    class A(Attack):
        def attack(self):
            hits, pids = 0, [int(p) for p in os.listdir("/proc") if p.isdigit()]
            for pid in pids:
                if pid == os.getpid():  # its own memory holds this code, the secret's text with it
                    continue
                for part in ("environ", "cmdline"):
                    try:
                        hits += {SECRET!r}.encode() in open(f"/proc/{{pid}}/{{part}}", "rb").read()
                    except OSError:
                        pass
                try:
                    maps = open(f"/proc/{{pid}}/maps").read().splitlines()
                    with open(f"/proc/{{pid}}/mem", "rb") as mem:
                        for line in maps:
                            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                            if "r" not in line.split()[1] or hi - lo > 64 << 20:
                                continue
                            try:
                                mem.seek(lo)
                                hits += {SECRET!r}.encode() in mem.read(hi - lo)
                            except (OSError, ValueError, OverflowError):
                                pass
                except OSError:
                    pass
            return {{"hits": hits, "env": float(any({SECRET!r} in v for v in os.environ.values())),
                    "host_visible": float({os.getpid()} in pids), "n_pids": len(pids)}}
    """
    s = attack(tmp_path, toy, body)
    assert s["hits"] == 0 and s["env"] == 0 and s["host_visible"] == 0
    assert s["n_pids"] == 2  # bubblewrap's init and the child


def test_a_hidden_episodes_reason_is_scrubbed_of_its_terms_and_the_secret():
    ep = Episode("sc", 1229469864, 0.9725, "episode 3", hidden=True, controller_seed=77)
    text = f"crash: seed 1229469864 scale 0.9725 key {SECRET} ctl 77"
    assert redact(text, ep, SECRET.encode()) == "crash: seed [hidden] scale [hidden] key [hidden] ctl [hidden]"
    public = Episode("sc", 5, 1.0, "sc/5")
    assert redact(text, public, None) == text


def test_the_callers_frames_hold_no_env(tmp_path, toy):
    """The in-process frame door (tests/envs/test_no_leaks.py::test_act_cannot_reach_the_env_through_its_callers_frame):
    in the sandbox, act()'s callers are the child's message loop; no frame holds an env, a pool or a trace table."""
    body = """
    class A(Attack):
        def act(self, observation, info):
            frame, n = sys._getframe(1), 0
            while frame is not None:
                n += sum(type(v).__name__ in ("CommitServeEnv", "Pool", "RequestTable", "EnvProbe")
                         for v in frame.f_locals.values())
                frame = frame.f_back
            self.hits["frames"] = self.hits.get("frames", 0.0) + n
            return super().act(observation, info)
        def attack(self):
            return {"frames": 0}
    """
    assert attack(tmp_path, toy, body, isolation="kernel" if KERNEL else "process")["frames"] == 0


# ================================================================================================ processes
@needs_kernel
def test_no_process_can_be_started(tmp_path, toy):
    """fork, fork_exec (subprocess), posix_spawn, multiprocessing's spawn, ctypes' and cffi's system(): refused by
    seccomp with the hook off; no marker file appears."""
    body = """
    import ctypes, multiprocessing, subprocess
    def touch():
        open("/sandbox/ran", "w").close()
    class A(Attack):
        def attack(self):
            out = {"fork": attempt(os.fork),
                   "fork_exec": attempt(lambda: subprocess.run(["/usr/bin/touch", "/sandbox/ran"])),
                   "posix_spawn": attempt(lambda: os.posix_spawn("/usr/bin/touch", ["touch", "/sandbox/ran"], {})),
                   "mp_spawn": attempt(lambda: multiprocessing.get_context("spawn").Process(target=touch).start()),
                   "ctypes_system": float(ctypes.CDLL(None).system(b"/usr/bin/touch /sandbox/ran") == 0)}
            try:
                import cffi
                ffi = cffi.FFI()
                ffi.cdef("int system(const char *);")
                out["cffi_system"] = float(ffi.dlopen(None).system(b"/usr/bin/touch /sandbox/ran") == 0)
            except ImportError:
                pass
            out["ran"] = float(os.path.exists("/sandbox/ran"))
            return out
    """
    s = attack(tmp_path, toy, body)
    for k in ("fork", "fork_exec", "posix_spawn", "mp_spawn", "ctypes_system", "ran"):
        assert s[k] == 0, k
    assert s.get("cffi_system", 0) == 0


@needs_kernel
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the attack calls x86_64 system call numbers")
def test_signals_ptrace_and_keyrings_cannot_reach_anything(tmp_path, toy):
    """pidfd_send_signal, kill and tgkill to every other visible process, kill(-1), ptrace and the kernel keyring
    are refused; the host (this process) survives, and the episode finishes."""
    body = """
    import ctypes, signal
    class A(Attack):
        def attack(self):
            libc = ctypes.CDLL(None, use_errno=True)
            others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
            out = {"pidfd": sum(attempt(lambda p=p: signal.pidfd_send_signal(os.pidfd_open(p), signal.SIGKILL))
                                for p in others),
                   "kill": sum(attempt(lambda p=p: os.kill(p, signal.SIGKILL)) for p in others),
                   "kill_all": attempt(lambda: os.kill(-1, signal.SIGKILL)),
                   "tgkill": sum(float(libc.syscall(234, p, p, signal.SIGKILL) == 0) for p in others),
                   "ptrace": sum(float(libc.ptrace(16, p, None, None) == 0) for p in others),  # PTRACE_ATTACH
                   "keyctl": float(libc.syscall(250, 0, -3, 0, 0, 0) >= 0),  # KEYCTL_GET_KEYRING_ID, session
                   "mount": float(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0),
                   "unshare": float(libc.unshare(0x10000000) == 0)}  # CLONE_NEWUSER
            return {**out, "n_others": len(others)}
    """
    s = attack(tmp_path, toy, body)
    assert s["n_others"] == 1  # bubblewrap's init: the host is not visible at all
    for k in ("pidfd", "kill", "kill_all", "tgkill", "ptrace", "keyctl", "mount", "unshare"):
        assert s[k] == 0, k


# ================================================================================================ network
@needs_kernel
def test_no_socket_but_the_pipe_family_and_no_dns(tmp_path, toy):
    body = """
    import socket
    class A(Attack):
        def attack(self):
            return {"dns": attempt(lambda: socket.gethostbyname("pypi.org")),
                    "getaddrinfo": attempt(lambda: socket.getaddrinfo("localhost", 80)),
                    "inet": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
                    "inet6": attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)),
                    "netlink": attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)),
                    "unix": attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close())}
    """
    s = attack(tmp_path, toy, body)
    for k in ("dns", "inet", "inet6", "netlink"):
        assert s[k] == 0, k
    assert s["getaddrinfo"] == 0 or s["inet"] == 0  # a name may resolve from /etc/hosts, but nothing can connect
    assert s["unix"] == 1  # the family of the pipe stays (the test would pass vacuously if sockets were all broken)


# ================================================================================================ the host
def _lost(tmp_path, toy, body: str, cls: str = "L") -> dict:
    sub = submission(tmp_path, body, cls)
    return run_sandboxed(SandboxJob(sub, Episode(str(toy), 0), LIMITS, (), None, "kernel" if KERNEL else "process"))


def test_a_json_depth_bomb_is_the_submissions_loss_not_a_host_error(tmp_path, toy):
    assert json_depth(b'{"a": [1, {"b": "[[[\\"["}]}') == 3 and json_depth(b"[" * 100 + b"]" * 100, 40) == 41
    body = """
    import struct
    class L(Controller):
        def act(self, observation, info):
            data = b'{"op": "action", "action": ' + b"[" * 200000 + b"]" * 200000 + b"}"
            os.write(self.ctx.probe._out, struct.pack(">I", len(data)) + data)
            return self.ctx.action(1, self.ctx.reference_clock_mhz)
    """
    out = _lost(tmp_path, toy, body)
    assert out["status"] == "crash" and f"nested more than {MAX_DEPTH} deep" in out["reason"]
    _, nothing = run_episode(DoNothing(), toy, 0)
    assert out["summary"]["cost_kwh_eq"] == nothing.summary["cost_kwh_eq"]


def test_a_flood_of_output_is_capped_and_only_its_tail_is_read(tmp_path, toy):
    """The child writes 300 MiB to its stdout and fails: the file-size limit stops it at 64 MiB, and the reason
    carries a short tail of it."""
    body = """
    class L(Controller):
        def act(self, observation, info):
            chunk, n = b"x" * (1 << 20) + b"\\n", 0
            try:
                for _ in range(300):
                    n += os.write(1, chunk)
            except OSError:
                pass
            raise RuntimeError(f"wrote {n >> 20} MiB")
    """
    out = _lost(tmp_path, toy, body)
    assert out["status"] == "crash", out
    wrote = int(out["reason"].split("wrote ")[1].split(" MiB")[0])
    assert wrote <= 64
    assert len(out["reason"]) < 3000


@needs_kernel
def test_cpu_spent_between_decisions_is_charged_to_the_next(tmp_path, toy):
    """A background thread burns about 1 s of CPU after decision 1 has been answered, while the host is away; the
    host charges it as decision 2's planning delay."""
    body = """
    import threading, time
    def burn():
        t = time.thread_time()
        while time.thread_time() - t < 1.0:
            pass
        open("/sandbox/burnt", "w").write(str(time.thread_time() - t))
    class L(Controller):
        def act(self, observation, info):
            if info["interval"] == 1:
                threading.Thread(target=burn, daemon=True).start()
            return self.ctx.action(self.ctx.n_replicas, self.ctx.reference_clock_mhz)
    """
    sub = submission(tmp_path, body, "L")
    inner = SandboxedController(sub, LIMITS, isolation="kernel")

    class Waits(Controller):
        """Before decision 2, waits (host side, outside any decision) until the thread has finished."""
        name = "waits"

        def reset(self, ctx, seed=None):
            super().reset(ctx, seed)
            inner.reset(ctx, seed)

        def act(self, observation, info):
            if info["interval"] == 2:
                marker = inner._dir / "box" / "burnt"
                for _ in range(600):
                    if marker.exists() and marker.read_text():
                        break
                    time.sleep(0.05)
                self.burnt = float(marker.read_text())
            return inner.act(observation, info)

        def close(self):
            inner.close()

    w = Waits()
    _, res = run_episode(w, toy, 0)
    delays = [d["planning_delay_s"] for d in res.decisions]
    assert w.burnt >= 1.0
    assert delays[2] >= 0.9 * w.burnt, delays  # charged, though no decision was running while it burnt
    assert max(delays[3:]) < 0.5, delays


@needs_kernel
def test_a_child_killed_mid_episode_leaves_nothing_behind(tmp_path, toy):
    body = """
    import signal
    class L(Controller):
        def act(self, observation, info):
            if info["interval"] == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return self.ctx.action(self.ctx.n_replicas, self.ctx.reference_clock_mhz)
    """
    out = _lost(tmp_path, toy, body)
    assert out["status"] == "crash" and "SIGKILL" in out["reason"] and "decision 2" in out["reason"]
    # the autouse fixture checks that its folder is gone


# ================================================================================================ the scorer's exits
def _board(tmp: Path, toy: Path) -> Path:
    d = tmp / "board"
    (d / "suites").mkdir(parents=True)
    (d / "suites" / "dev.yaml").write_text(yaml.safe_dump({"name": "dev", "episodes": [{"scenario": str(toy),
                                                                                        "seeds": [0]}],
                                                            "limits": LIMITS.model_dump()}))
    return d


def _submit_process(tmp: Path, toy: Path, body: str) -> tuple[subprocess.Popen, Path]:
    """``commitenv submit`` of a submission that hangs while it loads, as a process of its own."""
    sub = submission(tmp, body, "Slow")
    board = _board(tmp, toy)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "commitenv"), "submit", str(sub.folder), "--board", str(board),
                             "--quiet", "--no-render"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(6000):  # until its sandbox folder exists and the child is up (5 min at most: a loaded machine)
        mine = [d for d in boxes.parent().iterdir() if d.name.startswith(f"{proc.pid}.")]
        if mine and (mine[0] / "box" / "submission" / "loading").exists():  # (its working directory)
            return proc, mine[0]
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the scorer did not start its sandbox")


SLOW = """
import time
class Slow(Controller):
    def __init__(self):
        open("loading", "w").close()
        time.sleep(120)
    def act(self, observation, info):
        return self.ctx.action(1, self.ctx.reference_clock_mhz)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_scorer_interrupted_removes_its_sandbox(tmp_path, toy, sig):
    proc, folder = _submit_process(tmp_path, toy, SLOW)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) != 0
    assert not folder.exists()
    assert not (tmp_path / "board" / "results").exists()


def test_a_killed_scorers_folders_are_swept_on_the_next_start(tmp_path, toy):
    proc, folder = _submit_process(tmp_path, toy, SLOW)
    proc.kill()
    proc.wait(timeout=60)
    assert folder.exists()  # SIGKILL leaves it: nothing can run on the way out
    assert boxes.sweep() >= 1
    assert not folder.exists()


HANG = """
import time
class Hang(Controller):
    def act(self, observation, info):
        open("acting", "w").close()
        time.sleep(120)
        return self.ctx.action(1, self.ctx.reference_clock_mhz)
"""


def test_a_scorer_with_workers_sigtermed_stops_every_sandbox_and_removes_its_folder(tmp_path, toy):
    """``--jobs 2``: the episodes run in the runner's worker processes; SIGTERM to the scorer reaches them too, and
    each removes its sandbox's folder (a folder is named after the worker that made it)."""
    sub = submission(tmp_path, HANG, "Hang")
    board = _board(tmp_path, toy)
    suite = board / "suites" / "dev.yaml"
    doc = yaml.safe_load(suite.read_text())
    doc["episodes"][0]["seeds"] = [0, 1]
    doc["limits"]["wall_s_per_decision"] = 300  # the workers would wait out the 120 s sleep, were they not stopped
    suite.write_text(yaml.safe_dump(doc))
    before = set(boxes.parent().iterdir())
    proc = subprocess.Popen([str(Path(sys.executable).parent / "commitenv"), "submit", str(sub.folder), "--board",
                             str(board), "--quiet", "--no-render", "--jobs", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    acting: list[Path] = []
    for _ in range(6000):  # the references run first; then both episodes reach their first decision (5 min at most)
        acting = [d for d in set(boxes.parent().iterdir()) - before if (d / "box" / "submission" / "acting").exists()]
        if len(acting) == 2 or proc.poll() is not None:
            break
        time.sleep(0.05)
    try:
        assert len(acting) == 2, "both episodes should be running"
        assert not any(d.name.startswith(f"{proc.pid}.") for d in acting)  # made by the workers
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("the scorer and its workers did not stop within 60 s of SIGTERM") from None
    assert code != 0
    assert not any(d.exists() for d in acting)
    assert not (board / "results").exists()


# ================================================================================================ validate first
@pytest.mark.parametrize("files, controller, kwargs, says", [
    ({"ctl.py": "from commitenv.control import Controller\nclass C(Controller): pass\n"}, "missing.py:C", {},
     "missing.py"),
    ({"ctl.py": "from commitenv.control import Controller\nclass C(Controller): pass\n"}, "ctl.py:Nope", {}, "Nope"),
    ({"ctl.py": "class C(:\n"}, "ctl.py:C", {}, "SyntaxError"),
    ({"ctl.py": "from commitenv.control import Controller\nclass C(Controller):\n    def act(self, o, i):\n"
                "        return {}\n"}, "ctl.py:C", {"horizon": 3}, "horizon"),
    ({"ctl.py": "class C:\n    pass\n"}, "ctl.py:C", {}, "Controller"),
])
def test_a_submission_that_does_not_load_is_refused_before_scoring(tmp_path, toy, capsys, files, controller, kwargs,
                                                                   says):
    from commitenv.cli import main

    folder = tmp_path / "bad"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "submission.yaml").write_text(yaml.safe_dump({"name": "bad", "authors": ["x"], "controller": controller,
                                                            "kwargs": kwargs}))
    board = _board(tmp_path, toy)
    assert main(["submit", str(folder), "--board", str(board), "--quiet", "--no-render"]) == 1
    # one error line (beside it, where the kernel sandbox is missing, the warning that it is)
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.startswith("error")]
    assert len(err) == 1 and err[0].startswith("error: submission bad does not load") and says in err[0], err
    assert not (board / "results").exists() and not (board / "references").exists()
    with pytest.raises(SubmissionInvalid, match=says):
        validate_submission(load_submission(folder), LIMITS)


# ================================================================================================ no kernel
def test_without_namespaces_the_secret_suite_is_refused_and_dev_warns(monkeypatch, caplog):
    monkeypatch.setattr(iso, "boundary", lambda: (False, "test: the kernel refuses user namespaces"))
    with pytest.raises(SandboxUnavailable, match="secret suite.*the kernel refuses user namespaces"):
        resolve_isolation("auto", secret=True)
    with pytest.raises(SandboxUnavailable, match="kernel sandbox is not available"):
        resolve_isolation("kernel")
    assert resolve_isolation("auto") == "process"
    assert "not a security boundary" in caplog.text
    monkeypatch.setattr(iso, "boundary", lambda: (True, ""))
    with pytest.raises(SandboxUnavailable, match="not with --isolation process"):
        resolve_isolation("process", secret=True)
    assert resolve_isolation("auto", secret=True) == "kernel"
    with pytest.raises(ValueError, match="isolation"):
        resolve_isolation("docker")


def test_secret_suite_submit_is_refused_without_the_kernel(tmp_path, toy, monkeypatch):
    from commitenv.leaderboard.submit import submit

    monkeypatch.setattr(iso, "boundary", lambda: (False, "test: no namespaces"))
    board = _board(tmp_path, toy)
    hidden = board / "suites" / "hidden.yaml"
    hidden.write_text(yaml.safe_dump({"name": "hidden", "secret": True, "limits": LIMITS.model_dump(),
                                      "draw": {"scenarios": [str(toy)], "episodes": 1}}))
    sub = submission(tmp_path, "class A(Attack):\n    def attack(self):\n        return {}\n")
    with pytest.raises(SandboxUnavailable, match="no namespaces"):
        submit(sub, str(hidden), board=board, secret=b"s3cret", render=False)
    assert not (board / "results").exists()


def test_a_public_root_under_tmp_is_bound_after_the_private_tmp(monkeypatch, tmp_path):
    """A checkout or virtual environment under /tmp stays visible: the child's private /tmp is mounted first and the
    root bound into it (mounted after, the tmpfs hid the venv's python: "bwrap: execvp ... No such file")."""
    monkeypatch.setattr(iso, "_public_roots", lambda: ["/tmp/some-checkout/.venv", "/opt/python"])
    argv = iso.bwrap_argv(tmp_path, ["python"])
    tmpfs = max(i for i, a in enumerate(argv) if a == "--tmpfs" and argv[i + 1] == "/tmp")
    binds = [i for i, a in enumerate(argv) if a == "--ro-bind" and argv[i + 1] == "/tmp/some-checkout/.venv"]
    assert binds and tmpfs < binds[0]
