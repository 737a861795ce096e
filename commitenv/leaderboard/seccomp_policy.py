"""The system calls a sandboxed submission may not make: a seccomp-bpf filter built with libseccomp (`pyseccomp`).

The child (`commitenv.leaderboard._child`) installs it after Python and the packages the host's messages need are
loaded and before any submission code runs; the kernel then holds it for the life of the process (a filter cannot
be removed, and `no_new_privs`, which the filter requires, cannot be cleared). Everything not listed is allowed; a
denied call fails with EPERM (``clone3`` with ENOSYS, so that the C library falls back to ``clone``, whose flags
the filter can see). Denied:

- process creation: ``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD`` (threads stay allowed), ``execve``,
  ``execveat``;
- reaching other processes: ``ptrace``, ``process_vm_readv/writev``, ``pidfd_open``, ``pidfd_getfd``,
  ``pidfd_send_signal``, ``kcmp``, and ``kill``/``tgkill``/``rt_sigqueueinfo``/``rt_tgsigqueueinfo`` to any
  process but itself (``tkill`` altogether);
- sockets of any family but ``AF_UNIX`` (``socket``, ``socketpair``);
- the file system's shape: ``mount`` and the new mount API, ``umount2``, ``pivot_root``, ``chroot``;
- namespaces and kernel facilities: ``unshare``, ``setns``, ``add_key``, ``request_key``, ``keyctl``, ``bpf``,
  ``perf_event_open``, ``userfaultfd``, ``io_uring_*`` (its operations bypass seccomp), module and kexec loading,
  ``reboot``, ``swapon/off``, ``acct``, ``quotactl``, ``personality``;
- raising resource limits: ``setrlimit``, and ``prlimit64`` with a new limit.
"""

from __future__ import annotations

import errno
import socket

CLONE_THREAD = 0x00010000
DENIED = (
    "fork", "vfork", "execve", "execveat",
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "kcmp",
    "tkill",
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr",
    "unshare", "setns", "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "init_module", "finit_module", "delete_module",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "quotactl", "personality",
    "setrlimit",
)


def build(own_pid: int):
    """The filter (a ``pyseccomp.SyscallFilter``, not yet loaded) for the process ``own_pid``."""
    import pyseccomp as sc

    f = sc.SyscallFilter(defaction=sc.ALLOW)
    f.set_attr(sc.Attr.CTL_NNP, 1)
    eperm = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            f.add_rule(eperm, name)
        except (OSError, ValueError, RuntimeError):  # a call this architecture or libseccomp does not know
            continue
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    for name in ("socket", "socketpair"):
        f.add_rule(eperm, name, sc.Arg(0, sc.NE, socket.AF_UNIX))
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        f.add_rule(eperm, name, sc.Arg(0, sc.NE, own_pid))
    f.add_rule(eperm, "prlimit64", sc.Arg(2, sc.NE, 0))
    return f


def install(own_pid: int) -> None:
    """Load the filter into this process (it applies to all its threads, now and later); OSError if the kernel
    refuses."""
    import pyseccomp as sc

    f = build(own_pid)
    f.set_attr(sc.Attr.CTL_TSYNC, 1)  # threads already running (numpy's) get it too
    f.load()
