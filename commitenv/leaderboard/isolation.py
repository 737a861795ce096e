"""The kernel boundary around a sandboxed submission: bubblewrap namespaces over a read-only minimal root.

`bwrap_argv` builds the bubblewrap command that starts the child (`commitenv.leaderboard._child`) in new user, pid,
mount, network, IPC, UTS (and, where the kernel has them, cgroup) namespaces: the child's root file system holds only
``/usr`` and the Python installation, the virtual environment, the commitenv packages and the shipped (public)
scenarios and profiles, all read-only; a private ``/tmp``; a fresh ``/proc`` that shows only the sandbox's own
processes; a minimal ``/dev``; and its own folder, ``/sandbox``, the only place it may write. Its network namespace
is empty (no interface but a loopback that is down), so neither sockets nor DNS leave the box. It runs as the unused
uid/gid 65534 inside the user namespace with no capabilities, in a new session, and dies with its parent.

The child itself then adds what bubblewrap cannot (it must still exec Python): resource limits and a seccomp filter
(`commitenv.leaderboard.seccomp_policy`), before any submission code runs.

`boundary()` tells whether this machine can build the boundary (bubblewrap installed, user namespaces allowed,
libseccomp loadable) and, if not, why; the leaderboard refuses to score a secret suite without it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

BOX = "/sandbox"  # the child's folder, as it sees it
NOBODY = 65534  # the uid and gid inside the user namespace (mapped to the scorer's own outside)
# system files a Python process may want; bound read-only where they exist
_ETC = ("/etc/ld.so.cache", "/etc/localtime")


def package_paths() -> set[str]:
    """The Python library folders, the commitenv packages and the shipped scenarios and profiles (all public)."""
    import commitenv
    from commitenv._paths import data_dir, package_dir

    paths = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {str(Path(commitenv.__file__).parent), str(package_dir("commitenv_controllers"))}
    for kind in ("scenarios", "profiles"):
        try:
            paths.add(str(data_dir(kind)))
        except FileNotFoundError:
            pass
    return paths


def _public_roots() -> list[str]:
    """What the child may read besides /usr: the Python installation, the environment's packages, the commitenv
    packages and the shipped scenarios and profiles (all public)."""
    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix} | package_paths()
    real = sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)})
    # only the outermost of nested roots, and nothing /usr already holds
    out: list[str] = []
    for p in real:
        if p == "/usr" or p.startswith("/usr/") or any(p.startswith(q.rstrip("/") + "/") for q in out):
            continue
        out.append(p)
    return out


def _top_level() -> list[str]:
    """``/lib``, ``/lib64``, ``/bin``, ``/sbin``: symlinks into /usr on a merged-/usr system, else bound."""
    args: list[str] = []
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    return args


def _masks(denied: tuple[str, ...], roots: list[str]) -> list[str]:
    """Hide each denied path that lies under a bound root: an empty tmpfs over a folder, /dev/null over a file."""
    args: list[str] = []
    for d in denied:
        p = os.path.realpath(d)
        if not any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots + ["/usr"]):
            continue
        if os.path.isdir(p):
            args += ["--tmpfs", p]
        elif os.path.exists(p):
            args += ["--ro-bind", "/dev/null", p]
    return args


def bwrap_argv(box: Path, command: list[str], *, denied: tuple[str, ...] = (), info_fd: int | None = None,
               tmp_mb: int = 64) -> list[str]:
    """The bubblewrap command running ``command`` with ``box`` (the host's folder) as ``/sandbox`` (see the
    module docstring); ``denied`` paths are hidden even where they lie inside a public root."""
    roots = _public_roots()
    args = [shutil.which("bwrap") or "bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--uid", str(NOBODY), "--gid", str(NOBODY),
            "--disable-userns", "--hostname", "sandbox", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr", *_top_level(),
            # the private /tmp first: a public root under /tmp (a checkout or virtual environment there) is bound
            # into it afterwards rather than hidden by it
            "--size", str(tmp_mb << 20), "--tmpfs", "/tmp"]
    for r in roots:
        args += ["--ro-bind", r, r]
    for f in _ETC:
        if os.path.isfile(f):
            args += ["--ro-bind", f, f]
    args += _masks(denied, roots)
    args += ["--proc", "/proc", "--dev", "/dev", "--bind", str(box), BOX, "--chdir", BOX]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    return args + ["--", *command]


def app_pid(bwrap_child_pid: int) -> int | None:
    """The host pid of the sandboxed program: the only child of bubblewrap's init in the new pid namespace (the
    ``child-pid`` of its ``--info-fd`` report), from /proc's ``children`` list or, on a kernel without it, a scan
    of /proc for the process whose parent it is; None while it has not started yet."""
    try:
        with open(f"/proc/{bwrap_child_pid}/task/{bwrap_child_pid}/children") as fh:
            kids = fh.read().split()
        return int(kids[0]) if kids else None
    except OSError:
        pass
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == bwrap_child_pid:
                        return int(entry)
            except (OSError, IndexError, ValueError):
                continue
    return None


@functools.lru_cache(maxsize=1)
def boundary() -> tuple[bool, str]:
    """(available, why not): bubblewrap present, user/pid/mount/net namespaces allowed, libseccomp loadable."""
    if sys.platform != "linux":
        return False, f"the kernel boundary needs Linux (this is {sys.platform})"
    if shutil.which("bwrap") is None:
        return False, "bubblewrap (bwrap) is not installed (Debian: apt-get install bubblewrap)"
    try:  # loads libseccomp and builds (without loading) the filter the child will load
        from commitenv.leaderboard.seccomp_policy import build

        build(os.getpid())
    except Exception as e:  # noqa: BLE001  (ImportError, OSError, a missing symbol: the same answer)
        return False, f"libseccomp cannot be used through pyseccomp ({type(e).__name__}: {e})"
    try:
        r = subprocess.run([shutil.which("bwrap"), "--unshare-user", "--unshare-pid", "--unshare-net",
                            "--ro-bind", "/", "/", "--proc", "/proc", "--", "/bin/true"],
                           capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"}, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"bubblewrap could not be started ({e})"
    if r.returncode != 0:
        why = r.stderr.decode(errors="replace").strip()[-300:]
        return False, f"the kernel refuses the sandbox's namespaces (bwrap: {why or f'exit {r.returncode}'})"
    return True, ""
