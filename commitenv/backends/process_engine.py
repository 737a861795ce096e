"""`ProcessEngine`: a `ServingEngine` run in a process of its own and driven over a pipe, so that a pool of several
GPUs has one engine process per device (CUDA and vLLM bind a process to its devices; `HardwarePool`'s worker threads
then only wait on pipes), and `vllm_backend`, the pool factory of real GPUs: NVML for each GPU's clocks and energy,
a vLLM engine process per GPU.

The child builds the engine from a picklable ``factory(*args, **kwargs)`` after setting ``env`` (for a GPU:
``CUDA_VISIBLE_DEVICES``), then answers one call at a time. An exception in the child is raised in the parent as
`EngineProcessError` with the child's traceback; a child that dies or does not answer within ``timeout_s`` is an
error too, never a hang. Clocks passed to the factory keep working across the boundary: `WallClock` reads the
system-wide monotonic clock from its pickled origin.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from commitenv.backends.engine import ServingEngine, StepRecord
from commitenv.backends.lag import LagBound

_CALLS = ("add_request", "step", "has_work", "sleep", "wake")


class EngineProcessError(RuntimeError):
    """The engine process failed, died or did not answer."""


def _serve(conn: Any, factory: Callable[..., ServingEngine], args: tuple, kwargs: dict, env: dict[str, str]) -> None:
    """The child's loop: build the engine, then run each call it receives and send back its result or error."""
    os.environ.update(env)
    try:
        engine = factory(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001  (reported to the parent)
        conn.send(("err", f"{type(e).__name__}: {e}", traceback.format_exc()))
        return
    conn.send(("ok", None, ""))
    while True:
        try:
            name, call_args = conn.recv()
        except EOFError:
            return
        if name == "close":
            conn.send(("ok", None, ""))
            return
        try:
            conn.send(("ok", getattr(engine, name)(*call_args), ""))
        except BaseException as e:  # noqa: BLE001
            conn.send(("err", f"{type(e).__name__}: {e}", traceback.format_exc()))


class ProcessEngine(ServingEngine):
    """See the module docstring. ``name`` labels errors (e.g. "GPU 3")."""

    def __init__(self, factory: Callable[..., ServingEngine], *args: Any, env: dict[str, str] | None = None,
                 name: str = "engine", timeout_s: float = 900.0, start_method: str = "spawn", **kwargs: Any) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: expected > 0, got {timeout_s}")
        self.name, self.timeout_s = name, float(timeout_s)
        ctx = mp.get_context(start_method)
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, factory, args, kwargs, dict(env or {})), daemon=True,
                                 name=f"commitenv-{name}")
        self._proc.start()
        child.close()
        self._closed = False
        self._answer("start")  # the engine is built (a model load can take minutes: timeout_s)

    def _answer(self, what: str) -> Any:
        if not self._conn.poll(self.timeout_s):
            self._kill()
            raise EngineProcessError(f"{self.name}: no answer to {what} within {self.timeout_s:g} s")
        try:
            status, value, tb = self._conn.recv()
        except EOFError:
            self._kill()
            raise EngineProcessError(f"{self.name}: the engine process died during {what} "
                                     f"(exit code {self._proc.exitcode})") from None
        if status != "ok":
            raise EngineProcessError(f"{self.name}: {what} failed in the engine process: {value}\n{tb}")
        return value

    def _call(self, name: str, *args: Any) -> Any:
        if self._closed:
            raise EngineProcessError(f"{self.name}: {name}() after close()")
        try:
            self._conn.send((name, args))
        except (BrokenPipeError, OSError):
            self._kill()
            raise EngineProcessError(f"{self.name}: the engine process is gone (exit code {self._proc.exitcode})") \
                from None
        return self._answer(f"{name}()")

    def add_request(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        self._call("add_request", request_id, prompt_tokens, max_tokens)

    def step(self) -> StepRecord | None:
        return self._call("step")

    def has_work(self) -> bool:
        return bool(self._call("has_work"))

    def sleep(self) -> None:
        self._call("sleep")

    def wake(self) -> None:
        self._call("wake")

    def close(self) -> None:
        """Stop the engine process (once; later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._conn.send(("close", ()))
            self._conn.poll(10.0)
        except (BrokenPipeError, OSError):
            pass
        self._proc.join(10.0)
        self._kill()

    def _kill(self) -> None:
        self._closed = True
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5.0)

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self._kill()
        except Exception:
            pass


def _vllm_engine(model: str, clock: Any, engine_args: dict[str, Any]) -> ServingEngine:
    from commitenv.backends.vllm_engine import VllmEngine

    return VllmEngine(model, clock=clock, **engine_args)


def vllm_backend(model: str, gpus: Sequence[int] | None = None, *, lag_bound: LagBound | None = LagBound(), **engine_args: Any):
    """A pool factory for `CommitServeEnv(backend=...)` on real GPUs: replica i runs on GPU ``gpus[i]`` (default
    0..n-1) with an `NvmlGpu` and a vLLM engine (`VllmEngine`: ``model`` and ``engine_args``, the profile's token
    budget and sequence cap unless given) in its own process, on one wall clock; ``lag_bound``: the replay's
    `commitenv.backends.lag.LagBound` (None: measured, never held). Needs the ``gpu`` extra."""

    def build(profile, n: int, options, clock_mhz: int):
        from commitenv.backends.clock import WallClock
        from commitenv.backends.nvml import NvmlGpu
        from commitenv.backends.pool import HardwarePool

        ids = list(range(n)) if gpus is None else [int(g) for g in gpus]
        if len(ids) != n:
            raise ValueError(f"vllm_backend: the scenario has {n} replicas but {len(ids)} GPUs were given ({ids})")
        args = {"max_num_batched_tokens": profile.scheduler.token_budget, "max_num_seqs": profile.scheduler.max_seqs,
                **engine_args}
        clock = WallClock()
        devices = []
        try:
            for g in ids:
                gpu = NvmlGpu(g)
                devices.append((gpu, ProcessEngine(_vllm_engine, model, clock, args, name=f"GPU {g}",
                                                   env={"CUDA_VISIBLE_DEVICES": str(g)})))
        except BaseException:
            for _, eng in devices:
                eng.close()
            raise
        return HardwarePool(profile, devices, clock, options, clock_mhz=clock_mhz, lag_bound=lag_bound)

    return build


__all__ = ["EngineProcessError", "ProcessEngine", "vllm_backend"]
