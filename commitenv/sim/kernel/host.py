"""The host the compiled loop calls back into for a dispatch policy's choice and a local policy's plan (numba's
``objmode``: one call per routing or planned step, where the loop is, instead of leaving and re-entering `advance`):
the kernel state and pool whose call is running."""

from __future__ import annotations

CURRENT: list = []  # (KernelState, Pool) of the compiled calls in progress, innermost last


def plan(x: int, t: float, ints, flts) -> None:
    """Have the running pool's local policy plan replica ``x``'s step at ``t`` from its tasks (``ints``, ``flts``:
    `heap._task_rows`; `KernelPolicies._plan`)."""
    if not CURRENT or CURRENT[-1][1] is None:
        raise RuntimeError("kernel: a local policy's plans need the pool (KernelState.advance(..., pool=...))")
    ks, pool = CURRENT[-1]
    ks._plan(pool, x, t, ints, flts)


def dispatch(r: int, t: float) -> int:
    """The replica the running pool's dispatch policy chooses for request ``r`` at ``t`` (`KernelPolicies._choose`)."""
    if not CURRENT or CURRENT[-1][1] is None:
        raise RuntimeError("kernel: a dispatch policy's choices need the pool (KernelState.advance(..., pool=...))")
    ks, pool = CURRENT[-1]
    return ks._choose(pool, r, t)
