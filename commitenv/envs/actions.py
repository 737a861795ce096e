"""The env's action checks: an action is taken whole or refused with one error naming the key, the index and the
range expected (no clipping); a shared pool's placement is checked against GPU memory before anything applies."""

from __future__ import annotations

from typing import Any

import numpy as np

from commitenv.sim.interval import SharedConfig
from commitenv.sim.migration import MIGRATE_MODES


def check_action(action: Any, n_replicas: int, clocks_mhz: tuple[int, ...] | list[int]) -> tuple[int, int]:
    """A one-model pool's action as (active replicas, clock index); ValueError naming the key and what was expected."""
    if not isinstance(action, dict) or "active" not in action or "clock" not in action:
        raise ValueError(f"action: expected a dict with keys 'active' and 'clock', got {action!r}")
    extra = sorted(str(k) for k in action if k not in ("active", "clock"))
    if extra:
        raise ValueError(f"action: unknown key(s) {', '.join(extra)}; this scenario's action has only 'active' and "
                         "'clock'")
    vals = []
    for key in ("active", "clock"):
        try:
            v = np.asarray(action[key]).item()
        except (TypeError, ValueError):
            raise ValueError(f"action: 'active' and 'clock' must be integers, got {key}={action[key]!r}") from None
        if isinstance(v, bool) or not isinstance(v, int):  # a float, even 4.0, is not in the Discrete space
            raise ValueError(f"action: 'active' and 'clock' must be integers (the spaces are Discrete; ctx.action "
                             f"builds one from a whole float), got {key}={action[key]!r}")
        vals.append(v)
    a, c = vals
    if not 1 <= a <= n_replicas:
        raise ValueError(f"action['active']: expected 1..{n_replicas} replicas, got {a}")
    if not 0 <= c < len(clocks_mhz):
        raise ValueError(f"action['clock']: expected a level index 0..{len(clocks_mhz) - 1} "
                         f"(levels {clocks_mhz} MHz), got {c}")
    return a, c


def _replica_profile(env: Any, replica: int):
    """The profile of ``replica``'s model (replicas in the layout's order: GPU by GPU)."""
    models = [inst.model for insts in env.layout.gpus for inst in insts]
    return env.profiles[models[replica]]


def check_shared_action(env: Any, action: Any) -> SharedConfig:
    """A shared pool's action: ``active`` per model and ``clock`` (required); optional ``clocks`` per GPU
    (replaces ``clock`` GPU by GPU), ``shares`` and ``placement`` (GPU) per replica (absent: they stay), and
    ``migrate`` (index into `MIGRATE_MODES`: what the moves of this action do with running requests)."""
    keys = ("active", "clock", "clocks", "shares", "placement", "migrate")
    if not isinstance(action, dict) or "active" not in action or "clock" not in action:
        raise ValueError(f"action: expected a dict with keys 'active' (per model) and 'clock', optionally "
                         f"'clocks' (per GPU), 'shares' and 'placement' (per replica) and 'migrate', got {action!r}")
    extra = sorted(str(k) for k in action if k not in keys)
    if extra:
        raise ValueError(f"action: unknown key(s) {', '.join(extra)}; a shared pool's action has {', '.join(keys)}")

    def ints(key: str, n: int) -> list[int]:
        v = np.asarray(action[key])
        if v.ndim == 0:
            v = v.reshape(1)
        if v.shape != (n,) or v.dtype == bool or not np.issubdtype(v.dtype, np.integer):
            raise ValueError(f"action['{key}']: expected {n} integers (a float, even a whole one, is not in the "
                             f"MultiDiscrete space), got {action[key]!r}")
        return [int(x) for x in v]

    nl = len(env.clocks_mhz)
    active = ints("active", len(env.profiles))
    for m, (a, n) in enumerate(zip(active, env.replicas_per_model)):
        if not 1 <= a <= n:
            raise ValueError(f"action['active'][{m}]: expected 1..{n} instances of model "
                             f"'{env.model_names[m]}', got {a}")
    (clock,) = ints("clock", 1)
    if not 0 <= clock < nl:
        raise ValueError(f"action['clock']: expected a level index 0..{nl - 1} (levels {env.clocks_mhz} MHz), "
                         f"got {clock}")
    clocks = ints("clocks", env.n_gpus) if "clocks" in action else [clock] * env.n_gpus
    for g, c in enumerate(clocks):
        if not 0 <= c < nl:
            raise ValueError(f"action['clocks'][{g}]: expected a level index 0..{nl - 1}, got {c}")
    gpus = list(env.shared_cfg.gpus)
    if "placement" in action:
        gpus = ints("placement", env.n_replicas)
        for r, g in enumerate(gpus):
            if not 0 <= g < env.n_gpus:
                raise ValueError(f"action['placement'][{r}]: expected a GPU index 0..{env.n_gpus - 1}, got {g}")
            if g != env.shared_cfg.gpus[r] and _replica_profile(env, r).latencies.load_s is None:
                raise ValueError(f"action['placement'][{r}]: moving it needs cold-start figures "
                                 f"(latencies.load_s, load_w) in profile {_replica_profile(env, r).name}")
    migrate = "none"
    if "migrate" in action:
        (mi,) = ints("migrate", 1)
        if not 0 <= mi < len(MIGRATE_MODES):
            raise ValueError(f"action['migrate']: expected 0..{len(MIGRATE_MODES) - 1} "
                             f"({', '.join(MIGRATE_MODES)}), got {mi}")
        migrate = MIGRATE_MODES[mi]
    shares = list(env.shared_cfg.shares)
    if "shares" in action:
        v = np.asarray(action["shares"], dtype=float) if not isinstance(action["shares"], (str, bytes)) else None
        if v is None or v.shape != (env.n_replicas,) or not np.all(np.isfinite(v)):
            raise ValueError(f"action['shares']: expected {env.n_replicas} SM shares (one per replica), "
                             f"got {action['shares']!r}")
        for r, x in enumerate(v.tolist()):
            mn = _replica_profile(env, r).sm_share.min_share
            if not mn - 1e-12 <= x <= 1.0:
                raise ValueError(f"action['shares'][{r}]: expected {mn}..1.0, got {x}")
        shares = [float(x) for x in v]
    for g in range(env.n_gpus):
        tot = sum(x for x, gg in zip(shares, gpus) if gg == g)
        if tot > 1.0 + 1e-9:
            raise ValueError(f"action['shares'/'placement']: the instances on GPU {g} would get {tot:.3f} > 1 of "
                             f"its SMs")
    if "placement" in action:  # checked before anything applies, so that a refused move changes nothing else
        env.pool.check_memory(dict(enumerate(gpus)), set(gpus))
    return SharedConfig(tuple(active), tuple(clocks), tuple(shares), tuple(gpus), migrate)
