"""One decision interval of the engine: apply a configuration at its actuation time, run to the boundary. Shared
by the environment's step and the hindsight door's ground-truth forks, so both make exactly the same engine calls."""

from __future__ import annotations

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
