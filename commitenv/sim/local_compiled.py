"""Local plans made inside the compiled loop: the binary interface a `LocalPolicy` implements to plan a replica's steps
without a call back to the host (one per step otherwise: an hour of a shared pool plans about a million steps).

A policy that offers it returns a `CompiledPlan` from `LocalPolicy.compiled`: a numba ``cfunc`` of signature `PLAN_SIG`
(`compile_plan` makes one; a first-class function: the loop is compiled once for every such policy and loads from
numba's cache) and four
arrays it lays out as it likes, read and written only by that function (its parameters and its state; the policy's
Python side reads them back). The loop calls ::

    n = fn(t, replica, gpu, model, clock_level, levels_mhz, share, free_kv_blocks, block_tokens, token_budget,
           max_seqs, ints, flts, pf, pi, sf, si, out)

``ints`` and ``flts`` are the replica's tasks, one row each in the engine's order (running, then waiting), as a
`LocalView` gives them: ``ints`` columns (kernel row, slot, running, decode, tokens left, computed, prompt tokens,
generated, predicted output tokens, KV blocks held), ``flts`` columns (arrival, visible deadline, latest token time or
-1). ``clock_level`` indexes ``levels_mhz``, the GPU's clock levels. The function returns the plan's length ``n`` and
writes its rows into ``out[2 : 2 + n]`` (indices of ``ints`` rows, highest priority first, each at most once), the
clock level it requests for the GPU into ``out[0]`` (-1: none) and the step's token budget into ``out[1]`` (0: the
replica's); ``n = -1`` asks for the engine's vLLM scheduler (`StepPlan` None); any other negative value is an error.
The loop checks all of it as it checks a host plan (`check_plan`, `plan_budget`) and refuses a bad one.

The same policy must plan the same steps through `LocalPolicy.plan` (the step-by-step reference engine calls that, and
so does a pool with two different compiled policies on its replicas: the loop carries one).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np
from numba import cfunc, types

PLAN_SIG = types.int64(
    types.float64, types.int64, types.int64, types.int64, types.int64, types.int64[:], types.float64, types.int64,
    types.int64, types.int64, types.int64, types.int64[:, :], types.float64[:, :], types.float64[:, :],
    types.int64[:, :], types.float64[:, :], types.int64[:, :], types.int64[:])
"""The signature of a compiled plan function (see the module docstring)."""

OUT_HEADER = 2  # out[0]: clock level requested (-1: none); out[1]: token budget (0: the replica's); then the rows


class CompiledPlan(NamedTuple):
    """A policy's compiled plan function and the arrays it reads and writes (C-contiguous, their dtypes as `PLAN_SIG`
    says; the loop holds them for one `advance`, so the policy must not replace them meanwhile)."""

    fn: Any  # a numba cfunc of signature PLAN_SIG
    pf: np.ndarray  # float64, 2-d
    pi: np.ndarray  # int64, 2-d
    sf: np.ndarray  # float64, 2-d
    si: np.ndarray  # int64, 2-d


def _no_plan(t, replica, gpu, model, clock_level, levels_mhz, share, free_kv_blocks, block_tokens, token_budget,
             max_seqs, ints, flts, pf, pi, sf, si, out):  # pragma: no cover (compiled; never called by the loop)
    """The placeholder the loop carries when no replica plans in it or no pool answers for the policies: -2, which the
    loop refuses (a compiled plan needs its policy's arrays)."""
    return -2


@functools.cache
def compile_plan(py_func) -> Any:
    """``py_func`` compiled as a plan function (`PLAN_SIG`; numba caches it on disk), once per process and only when
    first asked for: importing a policy compiles nothing (the leaderboard sandbox, which refuses ctypes, imports
    controllers that never plan in a loop)."""
    return cfunc(PLAN_SIG, cache=True)(py_func)


_EMPTY_F = np.zeros((0, 0))
_EMPTY_I = np.zeros((0, 0), np.int64)


def none() -> CompiledPlan:
    """What the loop carries when no replica plans in it (`_no_plan`)."""
    return CompiledPlan(compile_plan(_no_plan), _EMPTY_F, _EMPTY_I, _EMPTY_F, _EMPTY_I)


def check_compiled(plan: CompiledPlan, policy: str) -> CompiledPlan:
    """``plan`` if its arrays have the dtypes, dimensions and layout `PLAN_SIG` takes; else a ValueError naming the
    policy and the array."""
    if not isinstance(plan, CompiledPlan):
        raise TypeError(f"local policy {policy!r}: compiled() must return a CompiledPlan or None, got "
                        f"{type(plan).__name__}")
    for name, dtype in (("pf", np.float64), ("pi", np.int64), ("sf", np.float64), ("si", np.int64)):
        a = getattr(plan, name)
        if not (isinstance(a, np.ndarray) and a.dtype == dtype and a.ndim == 2 and a.flags.c_contiguous):
            raise ValueError(f"local policy {policy!r}: CompiledPlan.{name}: a C-contiguous 2-d {np.dtype(dtype)} "
                             f"array expected, got {getattr(a, 'dtype', type(a).__name__)} "
                             f"{getattr(a, 'shape', '')}")
    if getattr(plan.fn, "_sig", None) != PLAN_SIG:
        raise ValueError(f"local policy {policy!r}: CompiledPlan.fn: a numba cfunc of signature PLAN_SIG expected")
    return plan
