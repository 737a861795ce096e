"""One decision interval of the engine: apply a configuration at its actuation time, run to the boundary. Shared
by the environment's step and the hindsight door's ground-truth forks, so both make exactly the same engine calls."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from commitenv.sim.pool import Pool


def run_interval(pool: Pool, cfg: tuple[int, int], new: tuple[int, int], t_apply: float, t1: float,
                 clocks_mhz: tuple[int, ...] | list[int]) -> tuple[tuple[int, int], list[tuple[str, float, int]]]:
    """Run ``pool`` to ``t1`` (settled there), switching from ``cfg`` to ``new`` (active replicas, clock index) at
    ``t_apply``; a change due at or after ``t1`` is stale and not applied. Returns the configuration in force at
    ``t1`` and the changes made, as ("active" | "clock", time, value)."""
    changes: list[tuple[str, float, int]] = []
    if new != cfg and not t_apply >= t1:
        pool.run_until(t_apply)
        if new[0] != cfg[0]:
            pool.set_active(t_apply, new[0])
            changes.append(("active", t_apply, new[0]))
        if new[1] != cfg[1]:
            pool.set_clock(t_apply, clocks_mhz[new[1]])
            changes.append(("clock", t_apply, clocks_mhz[new[1]]))
        cfg = new
    pool.run_until(t1)
    pool.settle(t1)
    return cfg, changes


@dataclass(frozen=True)
class SharedConfig:
    """A shared pool's configuration: active instances per model, clock level index per GPU, SM share per replica,
    GPU per replica (a change moves the instance) and how a move treats the running requests
    (`commitenv.sim.migration.MIGRATE_MODES`)."""

    active: tuple[int, ...]
    clocks: tuple[int, ...]
    shares: tuple[float, ...]
    gpus: tuple[int, ...]
    migrate: str = "none"


def per_model_counts(active: Any, replicas_per_model: tuple[int, ...], models: tuple[str, ...] = (),
                     low: int = 1) -> tuple[int, ...]:
    """A shared pool's active counts, one per model, each a whole number in ``low``..its instances (``low`` 0 where
    models scale to zero; a whole float is taken; bools, fractions and a wrong length are refused with a ValueError
    naming the entry)."""
    import numpy as np

    try:
        counts = None if isinstance(active, (int, np.integer)) else tuple(active)
    except TypeError:
        counts = None
    if counts is None or len(counts) != len(replicas_per_model):
        raise ValueError(f"active: a shared pool takes one active count per model "
                         f"({', '.join(models) if models else len(replicas_per_model)}), got {active!r}")
    for m, (a, n) in enumerate(zip(counts, replicas_per_model)):
        whole = isinstance(a, (int, np.integer, float, np.floating)) and float(a).is_integer()
        if isinstance(a, (bool, np.bool_)) or not whole or not low <= a <= n:
            name = f" ({models[m]})" if m < len(models) else ""
            raise ValueError(f"active[{m}]: expected a whole number in {low}..{n} instances of model {m}{name}, "
                             f"got {a!r}")
    return tuple(int(a) for a in counts)


def run_shared_interval(pool: Pool, cfg: SharedConfig, new: SharedConfig, t_apply: float, t1: float,
                        clocks_mhz: tuple[int, ...] | list[int]) -> tuple[SharedConfig, list[tuple[str, float, Any]]]:
    """`run_interval` for a pool of several models: switch each model's active count, each GPU's clock, and each
    replica's SM share and GPU that differ (shrinking shares, then moves, then growing shares, so a GPU's shares
    never sum above 1 on the way). Changes are ("active:<model>" | "clock:<gpu>" | "share:<replica>" |
    "move:<replica>", time, value). Where models scale to zero the engine wakes instances on demand, so a model's
    count is set again wherever the pool's differs from the action's."""
    changes: list[tuple[str, float, Any]] = []
    s2z = pool.opt.scale_to_zero  # (the pool's counts may differ from the last action's: set them where they do)
    if (replace(new, migrate=cfg.migrate) != cfg or s2z) and not t_apply >= t1:  # the mode alone changes nothing
        pool.run_until(t_apply)
        for m, (a, b) in enumerate(zip(cfg.active, new.active)):
            if a != b or (s2z and pool.active_count(m) != b):
                pool.set_active(t_apply, b, model=m)
                changes.append((f"active:{m}", t_apply, b))
        for g, (a, b) in enumerate(zip(cfg.clocks, new.clocks)):
            if a != b:
                pool.set_clock(t_apply, clocks_mhz[b], [g])
                changes.append((f"clock:{g}", t_apply, clocks_mhz[b]))
        resized = [(r, b) for r, (a, b) in enumerate(zip(cfg.shares, new.shares)) if a != b]
        resized.sort(key=lambda x: x[1] - cfg.shares[x[0]])  # shrinking shares first
        for r, b in [x for x in resized if x[1] < cfg.shares[x[0]]]:
            pool.set_share(t_apply, r, b)
            changes.append((f"share:{r}", t_apply, b))
        moved = {r: b for r, (a, b) in enumerate(zip(cfg.gpus, new.gpus)) if a != b}
        if moved:
            pool.move(t_apply, moved, new.migrate)
            changes.extend((f"move:{r}", t_apply, b) for r, b in moved.items())
        for r, b in [x for x in resized if x[1] > cfg.shares[x[0]]]:
            pool.set_share(t_apply, r, b)
            changes.append((f"share:{r}", t_apply, b))
        cfg = new
    pool.run_until(t1)
    pool.settle(t1)
    return cfg, changes
