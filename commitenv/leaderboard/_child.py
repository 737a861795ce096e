"""The submission's side of a sandboxed episode (run by `commitenv.leaderboard.sandbox` as
``python -I -m commitenv.leaderboard._child SPEC_JSON``, in a fresh folder, with a scrubbed environment; under
bubblewrap's namespaces where the kernel allows, `commitenv.leaderboard.isolation`).

Before any submission code runs, this process sets hard resource limits (address space, CPU seconds over the whole
episode, file size, open files, no core files), imports what the host will send, loads the seccomp filter
(`commitenv.leaderboard.seccomp_policy`; under the kernel isolation) and, as a second layer with its own error text,
installs an audit hook (`sys.addaudithook`, which cannot be removed but can be switched off from Python, which is
why it is not the boundary) that refuses: opening files outside the Python installation, the commitenv packages, the
shipped scenarios and profiles and its own folder (writes: its folder only); starting processes; sockets; signals to
other processes; raising resource limits; and, without the kernel boundary, ctypes beyond loading libraries that live
in those folders (behind it ctypes is let through: numba's compiler needs it, and native code meets seccomp). The
submission then sees only what the host sends: the context without a probe into the environment, observations, info
and snapshots on request.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

_BLOCKED = frozenset({
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn",
    "os.startfile", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "os.killpg", "resource.setrlimit", "resource.prlimit", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata",
    "ctypes.cdata/buffer", "ctypes.call_function", "ctypes.addressof", "sys.remote_exec", "os.setuid", "os.setgid",
})
# events that change the file system: the positions of their path arguments, each of which must be in the folder
_PATH_EVENTS = {"os.rename": (0, 1), "os.remove": (0,), "os.rmdir": (0,), "os.chmod": (0,), "os.chown": (0,),
                "os.symlink": (1,), "os.link": (0, 1), "os.truncate": (0,), "os.mkdir": (0,), "os.utime": (0,)}
_ETC_OK = ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group", "/etc/host.conf",
           "/etc/os-release", "/etc/mime.types", "/etc/timezone")
_SYSTEM_OK = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/share/zoneinfo", "/usr/local/lib",
              "/sys/devices/system/cpu", "/sys/fs/cgroup", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat",
              "/dev/null", "/dev/urandom", "/dev/random", "/dev/zero")


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


_CTYPES = frozenset(e for e in _BLOCKED if e.startswith("ctypes."))


def make_hook(read_roots: tuple[str, ...], write_root: str, denied: tuple[str, ...], native_ok: bool = False):
    """The audit hook: ``read_roots`` may be read, ``write_root`` written, ``denied`` never touched; ``native_ok``
    (behind the kernel boundary, where native code meets seccomp and the namespaces) lets ctypes through, which
    numba's compiler (the what-if engine's) needs."""
    own = f"/proc/{os.getpid()}"
    blocked = _BLOCKED - _CTYPES if native_ok else _BLOCKED
    reads = tuple(os.path.realpath(r) for r in read_roots) + _SYSTEM_OK + _ETC_OK + (own,)
    write_root = os.path.realpath(write_root)
    denied = tuple(os.path.realpath(d) for d in denied)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if isinstance(path, int) or path is None:
                return
            p = os.path.realpath(os.fsdecode(path) if isinstance(path, (bytes, os.PathLike)) else str(path))
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if _under(p, denied) or not _under(p, (write_root,) if writing else reads + (write_root,)):
                raise PermissionError(f"sandbox (audit hook): {'writing' if writing else 'reading'} {p} is not "
                                      "allowed")
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                a = args[i] if i < len(args) else None
                if isinstance(a, (str, bytes, os.PathLike)) and not _under(os.path.realpath(os.fsdecode(a)), (write_root,)):
                    raise PermissionError(f"sandbox (audit hook): {event} on {os.fsdecode(a)} is not allowed")
        elif event in blocked or (event == "os.kill" and args and args[0] not in (0, os.getpid())):
            raise PermissionError(f"sandbox (audit hook): {event} is not allowed")
        elif event == "ctypes.dlopen" and not native_ok:
            name = args[0] if args else None
            p = os.path.realpath(os.fsdecode(name)) if isinstance(name, (str, bytes)) and "/" in os.fsdecode(name) else None
            if p is None or not _under(p, reads):
                raise PermissionError(f"sandbox (audit hook): loading the library {name!r} is not allowed")

    return hook


class PipeProbe:
    """The submission's probe: ``snapshot()`` and ``recent_arrivals(window_s)`` ask the host; a reported planning
    delay is sent with the action (the host charges the larger of it and the CPU time it measured)."""

    __slots__ = ("_in", "_out", "reported")

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self._in, self._out, self.reported = in_fd, out_fd, 0.0

    def _ask(self, msg: dict[str, Any]) -> Any:
        from commitenv.leaderboard.wire import recv_pickle, send_json

        send_json(self._out, msg)
        kind, payload = recv_pickle(self._in)
        if kind == "error":
            raise ValueError(payload)
        return payload

    def snapshot(self):
        return self._ask({"op": "snapshot"})

    def recent_arrivals(self, window_s: float):
        return self._ask({"op": "recent_arrivals", "window_s": float(window_s)})

    def report_planning_delay(self, seconds: float) -> None:
        self.reported = float(seconds)


def _plain(value: Any) -> Any:
    """An action's values as JSON numbers where they are numpy scalars or one-element arrays."""
    import numpy as np

    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray) and value.size == 1:
        return value.reshape(()).item()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return repr(value)


_RLIMITS = {"as": resource.RLIMIT_AS, "cpu": resource.RLIMIT_CPU, "fsize": resource.RLIMIT_FSIZE,
            "nofile": resource.RLIMIT_NOFILE}


def set_limits(limits: dict[str, int]) -> None:
    """Hard resource limits (soft = hard, so the submission can only lower them), and no core files."""
    for name, value in limits.items():
        resource.setrlimit(_RLIMITS[name], (int(value), int(value)))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def boundary_status() -> dict[str, Any]:
    """What the kernel says about this process: its seccomp mode (2: a filter) and no_new_privs."""
    out: dict[str, Any] = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("Seccomp", "NoNewPrivs"):
                out[key] = int(value.strip())
    return out


def main() -> int:
    spec = json.loads(sys.argv[1])
    in_fd, out_fd = int(spec["in_fd"]), int(spec["out_fd"])
    set_limits(spec["rlimits"])
    root = spec["root"]
    os.chdir(root)
    # what the host sends, and the registry that builds the submission, are imported before the hook
    import numpy  # noqa: F401

    import commitenv.sim.whatif  # noqa: F401
    import commitenv.workload.table  # noqa: F401
    try:  # numba reads CPython's hash secret through ctypes when it first compiles; the hook refuses that later
        import numba.cpython.hashing  # noqa: F401
    except ImportError:
        pass
    from commitenv.sim.local_compiled import none

    none()  # the what-if loop's placeholder plan function, compiled or loaded now: numba's loader uses ctypes too
    from commitenv.control import Controller
    from commitenv.hindsight import uses_hindsight
    from commitenv.leaderboard.wire import recv_pickle, send_json
    from commitenv.registry import controller_name, resolve

    sys.path.insert(0, str(Path(root) / "submission"))
    if os.path.isdir(Path(root) / "submission"):  # its own folder is its working directory: relative paths in its
        os.chdir(Path(root) / "submission")       # kwargs (a policy folder, a table) name its files
    seccomp = False
    if spec.get("seccomp"):
        from commitenv.leaderboard.seccomp_policy import install

        install(os.getpid())
        kernel = boundary_status()
        seccomp = kernel.get("Seccomp") == 2 and kernel.get("NoNewPrivs") == 1
    sys.addaudithook(make_hook(tuple(spec["read_roots"]), root, tuple(spec["denied"]), native_ok=seccomp))
    stage = "load"
    try:
        factory = resolve(spec["controller"])
        try:
            ctrl = factory.make(**spec["kwargs"])
        except TypeError as e:
            names = ", ".join(sorted(spec["kwargs"])) or "none"
            raise TypeError(f"{spec['controller']}: building it with the submission's kwargs ({names}) failed: {e}"
                            ) from None
        if not isinstance(ctrl, Controller):
            raise TypeError(f"{spec['controller']}: expected a commitenv.control.Controller, got {type(ctrl).__name__}")
        if uses_hindsight(ctrl):
            send_json(out_fd, {"op": "refused", "reason": "the controller declares hindsight = True (a bound, "
                                                          "not a competitor)"})
            return 0
        send_json(out_fd, {"op": "ready", "name": controller_name(ctrl), "seccomp": seccomp})
        probe = PipeProbe(in_fd, out_fd)
        while True:
            msg = recv_pickle(in_fd)
            if msg[0] == "reset":
                stage = "reset"
                ctrl.reset(replace(msg[1], probe=probe), msg[2])
                for hook in ("dispatch_policy", "local_policy"):  # they would run per arrival or step, in the host
                    if getattr(ctrl, hook)() is not None:
                        raise ValueError(f"a {hook.replace('_', ' ')} (Controller.{hook}) cannot run in the "
                                         f"leaderboard sandbox yet; submit the controller without one")
                send_json(out_fd, {"op": "reset_done"})
            elif msg[0] == "act":
                stage = "act"
                probe.reported = 0.0
                action = ctrl.act(msg[1], msg[2])
                send_json(out_fd, {"op": "action", "action": _plain(action), "reported_delay_s": probe.reported})
            elif msg[0] == "close":
                stage = "close"
                ctrl.close()
                stats = {k: _plain(v) for k, v in (ctrl.stats() or {}).items()}
                send_json(out_fd, {"op": "stats", "stats": {k: v for k, v in stats.items()
                                                            if isinstance(v, (int, float)) and not isinstance(v, bool)}})
                return 0
    except BaseException as e:  # noqa: BLE001  (everything the submission raises is reported, then we exit)
        kind = "memory" if isinstance(e, MemoryError) else "crash"
        tb = traceback.format_exc(limit=-3)
        try:
            send_json(out_fd, {"op": "error", "kind": kind, "stage": stage,
                               "error": f"{type(e).__name__}: {e}"[:2000], "traceback": tb[-4000:]})
        except Exception:  # noqa: BLE001  (the host sees the exit)
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())
