"""Festina's decision costs against pool size, beside the paper's claims (sec. 3.3: dispatch "< 1 ms for 10,000
GPUs"; sec. 3.4: the local sweep "0.1 ms"):

* dispatch: `FestinaDispatch.choose` for one arrival over N candidate GPUs (one instance of the model on each, as
  when the dispatcher polls every local scheduler), on synthetic views with random queues, clocks and shares; and,
  where the engine can hold the pool, the engine's own per-arrival cost (views built from the compiled loop's arrays
  and the policy) on a pool of N one-instance GPUs serving a short burst;
* local sweep: `FestinaLocal.plan` for one step of one GPU holding T tasks, and its compiled plan alone on the task
  arrays (what the engine's loop pays per step; independent of the pool size: each GPU's
  scheduler runs beside its GPU);
* (the consolidation solve against the GPU count is benchmarks/bench_consolidation.py's.)

    python benchmarks/bench_festina_scale.py [--gpus 64 1024 10000] [--engine-gpus 64 1024] [--tasks 8 32 128 256]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from commitenv.profiles import load_profile
from commitenv.sim.dispatch import ArrivalView, CandidateView
from commitenv.sim.local import LocalView, TaskView
from commitenv.sim.local_compiled import OUT_HEADER
from commitenv_controllers.festina.dispatch import FestinaDispatch
from commitenv_controllers.festina.local import FestinaLocal, _task_arrays
from commitenv_controllers.festina.local_core import plan_core
from commitenv_controllers.festina.lut import FestinaLUT
from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)

PROFILE = "h100-qwen2.5-7b-festina"


def _per_call_us(fn, calls: int) -> float:
    """Median over 5 rounds of the mean time of ``calls`` calls of ``fn(i)``, in microseconds."""
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(calls):
            fn(i)
        rounds.append((time.perf_counter() - t0) / calls)
    return 1e6 * float(np.median(rounds))


def synthetic_candidates(n: int, clocks: tuple[int, ...], rng: np.random.Generator, kv_blocks: int,
                         block_tokens: int) -> tuple[CandidateView, ...]:
    """One instance on each of ``n`` GPUs, with random queues, KV use, clocks and SM shares."""
    out = []
    shares = (0.3, 0.4, 0.5, 0.6, 1.0)
    for g in range(n):
        running = int(rng.integers(0, 12))
        waiting = int(rng.integers(0, 3))
        free = int(rng.integers(kv_blocks // 4, kv_blocks))
        out.append(CandidateView(g, g, running + waiting, running, waiting, free, kv_blocks,
                                 int(clocks[rng.integers(len(clocks))]), float(shares[rng.integers(len(shares))]), 0,
                                 block_tokens, int(rng.integers(0, 4096)), int(running * rng.integers(200, 1500))))
    return tuple(out)


def bench_dispatch(lut: FestinaLUT, profile, sizes: list[int], seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    clocks = tuple(c.mhz for c in profile.clocks)
    sch = profile.scheduler
    rows = []
    for n in sizes:
        disp = FestinaDispatch(lut)
        cands = synthetic_candidates(n, clocks, rng, sch.kv_capacity_tokens // sch.block_size, sch.block_size)
        reqs = [ArrivalView(i, 10.0 + 0.01 * i, int(rng.integers(32, 4096)), int(rng.integers(16, 600)),
                            10.0 + 0.01 * i + float(rng.uniform(5, 60)), 0, 0) for i in range(64)]
        calls = max(20, min(2000, 200_000 // n))
        us = _per_call_us(lambda i: disp.choose(reqs[i % len(reqs)], cands), calls)
        rows.append({"gpus": n, "us_per_arrival": round(us, 2), "calls": calls, "phases": dict(disp.decisions)})
        print(f"dispatch over {n:>6,} GPUs: {us:9.1f} us per arrival (policy only, synthetic views)")
    return rows


def bench_engine_dispatch(lut: FestinaLUT, profile, sizes: list[int], seed: int = 0) -> list[dict]:
    """The engine's per-arrival dispatch cost (views from the compiled loop's arrays + the policy) on N GPUs."""
    from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
    from commitenv.workload.table import make_table

    rows = []
    for n in sizes:
        rng = np.random.default_rng(seed)
        k = 2000
        table = make_table(np.sort(rng.uniform(0.0, 20.0, k)), rng.integers(32, 2048, k), rng.integers(16, 400, k))
        pool = Pool(profile, PoolLayout.single(n), EngineOptions(noise=NoiseSpec(0, 0)))
        pool.dispatch = FestinaDispatch(lut)
        pool.attach(table)
        c0 = time.process_time()
        pool.run_until(math.inf)
        cpu = time.process_time() - c0
        us = 1e6 * pool.dispatch_s / max(pool.dispatch_calls, 1)
        rows.append({"gpus": n, "us_per_arrival": round(us, 2), "arrivals": pool.dispatch_calls,
                     "run_cpu_s": round(cpu, 2)})
        print(f"engine dispatch on {n:>6,} GPUs: {us:9.1f} us per arrival ({pool.dispatch_calls} arrivals, "
              f"run {cpu:.1f} s CPU)")
    return rows


def synthetic_tasks(t: int, rng: np.random.Generator, now: float) -> tuple[TaskView, ...]:
    """``t`` tasks: three quarters decoding, the rest prefills (running chunks or waiting)."""
    out = []
    for s in range(t):
        prompt = int(rng.integers(32, 2048))
        if s < 3 * t // 4:
            gen = int(rng.integers(1, 300))
            out.append(TaskView(s, True, True, 1, prompt + gen - 1, prompt, gen, gen + int(rng.integers(1, 300)),
                                now - float(rng.uniform(1, 20)), now + float(rng.uniform(1, 30)),
                                (prompt + gen) // 16 + 1, now - float(rng.uniform(0.0, 0.08))))
        else:
            done = int(rng.integers(0, prompt))
            out.append(TaskView(s, done > 0, False, prompt - done, done, prompt, 0, int(rng.integers(16, 600)),
                                now - float(rng.uniform(0, 0.3)), now + float(rng.uniform(2, 30)), done // 16, -1.0))
    return tuple(out)


def bench_local(lut: FestinaLUT, profile, sizes: list[int], seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    clocks = tuple(c.mhz for c in profile.clocks)
    sch = profile.scheduler
    rows = []
    for t in sizes:
        pol = FestinaLocal(lut)
        views = [LocalView(100.0, 0, 0, 0, clocks[-1], clocks, 0.5, int(rng.integers(100, 5000)), sch.block_size,
                           sch.token_budget, max(sch.max_seqs, t), synthetic_tasks(t, rng, 100.0)) for _ in range(16)]
        us = _per_call_us(lambda i: pol.plan(views[i % len(views)]), max(50, 20_000 // t))
        # what the engine's loop pays: the compiled plan on the task arrays it builds (no view, no Python per step)
        pol._ensure(1, 1, max(sch.max_seqs, t))
        arrays = [_task_arrays(v) for v in views]
        levels = np.array(clocks, np.int64)
        out = np.empty(t + OUT_HEADER, np.int64)

        def core_plan(i: int) -> None:
            v, (ints, flts) = views[i % len(views)], arrays[i % len(views)]
            plan_core(v.t, 0, 0, 0, len(clocks) - 1, levels, v.share, v.free_kv_blocks, v.block_tokens,
                      v.token_budget, v.max_seqs, ints, flts, pol._pf, pol._pi, pol._sf, pol._si, out)

        core = _per_call_us(core_plan, max(50, 20_000 // t))
        rows.append({"tasks": t, "us_per_step": round(us, 2), "compiled_us_per_step": round(core, 2)})
        print(f"local sweep with {t:>4} tasks: {us:9.1f} us per step through plan(view), {core:7.1f} us compiled")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[14, 64, 1024, 10000])
    ap.add_argument("--engine-gpus", type=int, nargs="*", default=[64, 1024])
    ap.add_argument("--tasks", type=int, nargs="+", default=[8, 32, 128, 256])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    profile = load_profile(PROFILE)
    lut = FestinaLUT.from_profile(profile)
    out = {"machine_factor": machine_factor(),
           "dispatch": bench_dispatch(lut, profile, a.gpus),
           "engine_dispatch": bench_engine_dispatch(lut, profile, a.engine_gpus),
           "local": bench_local(lut, profile, a.tasks),
           "paper": {"dispatch_ms_at_10000_gpus": "< 1", "local_sweep_ms": 0.1}}
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
