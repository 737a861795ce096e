"""Compile the engine's numba loop ahead of any run: ``python -m commitenv.sim.compile``.

Every ``@njit(cache=True)`` function of `commitenv.sim.kernel` (and the truth model's `_ar1`) is compiled for the
exact signatures an episode meets, by driving the bench hour's pool through the kernel for a few simulated minutes,
as the env does: import from a pool, set_active, set_clock, advance, meter, the step log, the queue and live-state
reads, `in_flight`, a what-if fork (compacted, no log) and a logged copy, a compaction, settle. numba writes each
compiled function to its cache (next to the sources in ``__pycache__``, or under ``NUMBA_CACHE_DIR``; a user-wide
folder when the package is read-only), so later processes (pytest-xdist workers, env runs) load instead of
compiling. A second call loads everything from that cache. `signatures()` lists what each dispatcher holds (tests
compare it before and after a run). ``--clean`` first empties the cache (after editing a kernel module: numba does not
notice a callee's change in a cached caller).
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import time
from pathlib import Path


def dispatchers() -> dict[str, object]:
    """Every numba dispatcher of the engine, by ``module.name``."""
    from numba.core.registry import CPUDispatcher

    from commitenv.sim import truth
    from commitenv.sim.kernel import actuate, cached, heap, lifecycle, loop, policies, prefix, segment

    out: dict[str, object] = {}
    for mod in (heap, prefix, cached, segment, lifecycle, actuate, loop, policies, truth):
        for name, obj in vars(mod).items():
            if isinstance(obj, CPUDispatcher) and obj.py_func.__module__ == mod.__name__:
                out[f"{mod.__name__.rsplit('.', 1)[-1]}.{name}"] = obj
    return out


def signatures() -> dict[str, list[str]]:
    """The signatures each dispatcher has compiled or loaded in this process (as text, sorted)."""
    return {name: sorted(str(s) for s in d.signatures) for name, d in dispatchers().items()}


def cache_counts() -> tuple[int, int]:
    """(compiled, loaded): signatures compiled in this process (numba's cache misses) and loaded from its cache (hits),
    over every dispatcher. A function loaded from the cache carries its callees inside, so they count nothing."""
    compiled = loaded = 0
    for d in dispatchers().values():
        st = d.stats
        compiled += sum(st.cache_misses.values())
        loaded += sum(st.cache_hits.values())
    return compiled, loaded


def cache_dir() -> str:
    """Where numba keeps the engine's compiled functions (the cache folder of `advance`)."""
    from commitenv.sim.kernel.loop import advance

    return str(advance.stats.cache_path)


@functools.lru_cache(maxsize=1)
def ensure_compiled() -> tuple[int, int]:
    """`warm` once per process (loads from the cache when it is warm; compiles and fills it when not): (compiled,
    loaded) as `cache_counts` after it."""
    warm()
    return cache_counts()


def export_cache(dest: str | Path) -> int:
    """Copy the engine's compiled functions (after `ensure_compiled`) into ``dest`` laid out as numba reads a
    ``NUMBA_CACHE_DIR`` of that name for the same source files (one folder per source folder, named from its path):
    a process started with ``NUMBA_CACHE_DIR=dest`` that sees the sources at the same paths loads instead of compiling.
    Copies, never links: what that process writes there stays its own. Returns the number of files copied."""
    from numba.core.caching import UserProvidedCacheLocator

    ensure_compiled()
    dest = Path(dest)
    n = 0
    for folder, py_file in {(str(d.stats.cache_path), d.py_func.__code__.co_filename)
                            for d in dispatchers().values()}:
        files = [f for f in os.listdir(folder) if f.endswith((".nbi", ".nbc"))] if os.path.isdir(folder) else []
        if not files:
            continue
        out = dest / UserProvidedCacheLocator.get_suitable_cache_subpath(py_file)
        out.mkdir(parents=True, exist_ok=True)
        for f in files:
            if not (out / f).exists():
                shutil.copyfile(os.path.join(folder, f), out / f)
                n += 1
    return n


def _tiny_pool(attach: bool = True):
    """A new pool of the bench hour's kind (the bench H200 hour's profile, layout and options: its truth model), with
    that hour's workload attached unless ``attach`` is False; not stepped."""
    from commitenv.envs import CommitServeEnv
    from commitenv.sim.pool import Pool

    env = CommitServeEnv("bench-h200-hour-fixed-a30")
    env.reset(seed=0)
    src = env.pool
    pool = Pool(src.profiles, src.layout, src.opt)
    if attach:
        pool.attach(src.table)
    pool.table = src.table  # (the workload, for a caller that attaches a variant)
    return pool


def warm() -> None:
    """Drive every compiled entry point with the argument types an episode gives it (the host-side calls of
    `KernelState`, and the two functions only its step log and `Pool.in_flight` reach, called directly)."""
    import numpy as np

    from commitenv.sim.kernel import R_BATCH_N
    from commitenv.sim.kernel.loop import in_flight
    from commitenv.sim.kernel.segment import _decode_flags

    pool = _tiny_pool()
    ks = pool._ks
    clocks = list(ks.clock_mhz)
    ks.set_active(0.0, ks.R)
    ks.set_clock(1.0, int(clocks[0]))
    ks.set_clock(1.5, int(clocks[1]), [0])
    ks.set_share(2.0, 0, 1.0, pool.profiles[0])
    for k in range(1, 4):
        ks.set_active(60.0 * k - 1.0, max(1, ks.R - k))
        ks.advance(60.0 * k)
        ks.meter(60.0 * k)
        ks.take_finished()
        ks.take_log()
    ks.set_clock(ks.sf[0], int(clocks[-1]))
    ks.move(float(ks.sf[0]), 0, (int(ks.gpu_of()[0]) + 1) % ks.G, "all", pool)  # (an instance moves, requests migrate)
    ks.advance(float(ks.sf[0]) + 20.0)
    ks.take_finished()
    ks.take_log()
    ks.waiting_ids(0)
    ks.queue_counts()
    ks.live_state()
    ks.live_deadlines()
    t = float(ks.sf[0])
    in_flight(t, ks.ri, ks.rf)
    nb = int(ks.ri[0, R_BATCH_N])
    _decode_flags(ks.qi, ks.bq[0, :nb], np.ones(nb, np.int64))
    _decode_flags(ks.qi, ks.bq[0, :nb], ks.bk[0, :nb])
    fork = ks.copy(log=False)  # (a what-if fork: compacted copy, no step log)
    fork.set_active(t, ks.R)
    fork.advance(t + 30.0)
    fork.settle(fork.sf[0])
    ks.copy().advance(t + 10.0)
    ks._compact()
    ks.advance(t + 60.0)
    ks.settle(ks.sf[0])
    ks.take_finished()
    ks.take_log()
    _warm_policies()
    _warm_prefix()


def _warm_policies() -> None:
    """The hand-backs to a dispatch policy (with token loads) and a local policy (with a clock in its plans): routing,
    re-routing on a deactivation, planned steps."""
    from commitenv.sim.dispatch import LeastUnfinished
    from commitenv.sim.local import FcfsLocal, StepPlan

    class LoadAware(LeastUnfinished):
        wants_load = True

    class Clocked(FcfsLocal):
        def plan(self, view):
            return StepPlan(super().plan(view).order, view.clocks_mhz[len(view.tasks) % len(view.clocks_mhz)])

    pool = _tiny_pool()
    pool.dispatch = LoadAware()
    pool.set_local_policy(Clocked())
    ks = pool._ks
    ks.set_active(0.0, ks.R, 0, pool)
    for k in range(1, 3):
        ks.set_active(30.0 * k - 1.0, max(1, ks.R - k), 0, pool)
        ks.advance(30.0 * k, False, pool)
        ks.take_finished()


def _warm_prefix() -> None:
    """A pool with prefix caches (the bench hour's requests given shared hash blocks) and a prefix-aware router:
    run past hits, evictions and a move, and copied."""
    import dataclasses

    import numpy as np

    from commitenv.sim.dispatch import PrefixAffinity
    from commitenv.sim.kernel.prefix import free_entries, shareable

    pool = _tiny_pool(attach=False)
    pool.dispatch = PrefixAffinity()  # (its views ask the caches for hits)
    table = pool.table
    n = len(table)
    blocks = np.minimum(table.prompt_tokens // pool.opt.prefix_block_tokens + 1, 4)
    offs = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)
    hashes = np.concatenate([np.arange(b) + 100 * (i % 3) for i, b in enumerate(blocks)]).astype(np.int64)
    pool.attach(dataclasses.replace(table, prefix_offsets=offs, prefix_hashes=hashes))
    ks = pool._ks
    if n == 0:
        raise RuntimeError("compile: the prefix warm-up pool has no requests")
    pool.set_active(0.0, ks.R)
    pool.run_until(30.0)
    ks.move(30.0, 0, (int(ks.gpu_of()[0]) + 1) % ks.G, "all", pool)  # (no cold-start check here: types only)
    pool.sync_from_kernel(ks)
    pool.run_until(60.0)
    ks.copy(log=False).advance(70.0, False, pool)
    free_entries(ks.pfx[0], ks.pfx[2], ks.pfx[3], 0, np.zeros(ks.pfx[3].shape[0], np.int64))
    pool.run_until(80.0)
    shareable(3, 10, 4)


def clean() -> int:
    """Delete the engine's compiled functions from numba's cache (the folder `cache_dir` names). numba checks a
    cached function against its own source file only, not its callees': after an edit of a kernel module, a caller
    cached before it would run the old callee (stale), so a developer cleans before compiling again. Returns how many
    files went."""
    n = 0
    for folder in {str(d.stats.cache_path) for d in dispatchers().values()}:
        for f in list(Path(folder).glob("*.nbi")) + list(Path(folder).glob("*.nbc")):
            f.unlink()
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--clean" in args:
        print(f"commitenv.sim.compile: {clean()} cached files removed")
    t0 = time.process_time()
    warm()
    cpu = time.process_time() - t0
    compiled, loaded = cache_counts()
    print(f"commitenv.sim.compile: {len(dispatchers())} functions; {compiled} signatures compiled, {loaded} loaded "
          f"from the cache, in {cpu:.1f} s CPU (cache: {cache_dir()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
