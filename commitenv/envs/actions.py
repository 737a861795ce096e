"""The env's actions: the checks (an action is taken whole or refused with one error naming the key, the index and
the range expected; no clipping) and, for a shared pool, the action space whose every point is legal with its two
maps: share weights onto each GPU's simplex of SM shares (`shares_from_weights`) and GPU requests onto a placement
that fits memory (`placement_from_request`). A shared pool's placement is checked against GPU memory before
anything applies."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from gymnasium import spaces

from commitenv.sim.devices import device_state
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


# ================================================================================================ shared pools
# A shared pool's action has two forms of its SM shares and placement (the other keys are common to both):
#
# * the space's form (``env.action_space``, what a learner samples and outputs): ``share_weights`` (a Box of
#   weights in [0, 1], one per instance) and ``gpu_request`` (one index per instance: 0 stays, g + 1 asks for GPU g).
#   Every point of it is a legal action: the weights map onto each GPU's simplex above the profiles' minimum shares
#   (`shares_from_weights`), and a request is granted only as far as GPU memory and minimum shares allow
#   (`placement_from_request`); nothing is refused or clipped, the map decides.
# * the exact form (controllers, `commitenv.control.ControllerContext.action`): ``shares`` (the SM share of every
#   instance) and ``placement`` (the GPU of every instance). Taken as given or refused whole with an error naming
#   the field, the element and the range (no clipping, no mapping).
#
# One action may mix them (e.g. exact ``placement`` with ``share_weights``), but not give both forms of one setting.

SHARED_SPACE_KEYS = ("active", "clock", "clocks", "share_weights", "gpu_request", "migrate")
SHARED_KEYS = ("active", "clock", "clocks", "shares", "share_weights", "placement", "gpu_request", "migrate")
STAY = 0  # a gpu_request value: the instance stays where it is (g + 1 asks for GPU g)
SUM_TOL = 1e-9  # the engine's tolerance on a GPU's summed SM and memory shares (`commitenv.sim.placement`)


def shared_action_space(replicas_per_model: tuple[int, ...], levels: int, n_gpus: int, n_replicas: int,
                        scale_to_zero: bool = False) -> spaces.Dict:
    """A shared pool's action space (every point legal; the module's comment above and docs/env.md):

    * ``active``: ``MultiDiscrete(replicas_per_model, start=1)``, model m's active instances 1..n_m (with
      ``scale_to_zero``, ``MultiDiscrete([n_m + 1], start=0)``: 0..n_m);
    * ``clock``: ``Discrete(levels)``, the clock level of every GPU (``clocks`` replaces it GPU by GPU);
    * ``clocks``: ``MultiDiscrete([levels] * G)``, GPU g's clock level;
    * ``share_weights``: ``Box(0, 1, (n_replicas,), float64)``, instance i's weight in its GPU's SM split
      (`shares_from_weights`);
    * ``gpu_request``: ``MultiDiscrete([G + 1] * n_replicas)``, 0: instance i stays, g + 1: it asks for GPU g
      (`placement_from_request`);
    * ``migrate``: ``Discrete(len(MIGRATE_MODES))``, what this action's moves do with running requests.

    Instances are numbered in the scenario's placement order (GPU by GPU), as everywhere in the env."""
    return spaces.Dict({
        "active": spaces.MultiDiscrete([n + int(scale_to_zero) for n in replicas_per_model],
                                       start=[0 if scale_to_zero else 1] * len(replicas_per_model)),
        "clock": spaces.Discrete(levels),
        "clocks": spaces.MultiDiscrete([levels] * n_gpus),
        "share_weights": spaces.Box(0.0, 1.0, (n_replicas,), dtype=np.float64),
        "gpu_request": spaces.MultiDiscrete([n_gpus + 1] * n_replicas),
        "migrate": spaces.Discrete(len(MIGRATE_MODES)),
    })


def shares_from_weights(weights: Sequence[float], gpus: Sequence[int], min_shares: Sequence[float],
                        n_gpus: int) -> list[float]:
    """SM shares of the space's ``share_weights`` on the placement ``gpus`` (instance -> GPU): on every GPU g with
    instances R_g,

        share_i = m_i + (1 - sum_{j in R_g} m_j) * w_i / sum_{j in R_g} w_j        (i in R_g)

    with m_i instance i's ``sm_share.min_share``; when every weight on g is 0, w_j = 1 for all of R_g (an equal
    split of what is above the minimums). So each share is >= its minimum and a GPU's shares sum to 1 (an alone
    instance gets the whole GPU). Only the ratios of weights on one GPU matter. A share is capped at 1.0 against
    rounding. Raises ValueError (naming the GPU) when the minimums on a GPU sum above 1, which no placement the
    space decodes can do (`placement_from_request` keeps them within 1)."""
    out = [0.0] * len(gpus)
    members: list[list[int]] = [[] for _ in range(n_gpus)]
    for r, g in enumerate(gpus):
        members[g].append(r)
    for g, on in enumerate(members):
        if not on:
            continue
        floor = math.fsum(min_shares[r] for r in on)
        if floor > 1.0 + SUM_TOL:
            raise ValueError(f"the minimum SM shares (sm_share.min_share) of the instances on GPU {g} sum to "
                             f"{floor:.3f} > 1")
        free = max(1.0 - floor, 0.0)
        total = math.fsum(float(weights[r]) for r in on)
        for r in on:
            frac = float(weights[r]) / total if total > 0.0 else 1.0 / len(on)
            out[r] = min(min_shares[r] + free * frac, 1.0)
    return out


def placement_from_request(request: Sequence[int], current: Sequence[int], n_gpus: int,
                           memory_shares: Sequence[float], sm_need: Sequence[float],
                           movable: Sequence[bool]) -> list[int]:
    """The placement (instance -> GPU) of the space's ``gpu_request`` from the ``current`` one: instance i asks to
    stay (``request[i] == 0``) or for GPU ``request[i] - 1``; an instance that cannot move (its profile has no
    cold-start figures, ``movable[i]`` False) stays. A placement is legal when on every GPU the instances' memory
    shares (reserved when first placed and carried along, `commitenv.sim.memory`) and their SM needs (``sm_need``:
    the minimum shares when ``share_weights`` come with it, else the shares that will apply) each sum to <= 1.

    The request itself when legal (so swaps are possible); otherwise, from the current placement, instances in
    index order go to the GPU they asked for whenever that keeps the destination legal, and stay otherwise. The
    result is legal whenever the current placement is (every GPU only ever gains what fits), so no request can
    overcommit a GPU's memory; deterministic, and a request that is legal is granted exactly."""
    n = len(current)
    want = [int(current[r]) if int(q) == STAY or not movable[r] else int(q) - 1 for r, q in enumerate(request)]

    def loads(place: Sequence[int]) -> tuple[list[float], list[float]]:
        mem, sm = [0.0] * n_gpus, [0.0] * n_gpus
        for r, g in enumerate(place):
            mem[g] += memory_shares[r]
            sm[g] += sm_need[r]
        return mem, sm

    mem, sm = loads(want)
    if max(mem) <= 1.0 + SUM_TOL and max(sm) <= 1.0 + SUM_TOL:
        return want
    place = [int(g) for g in current]
    mem, sm = loads(place)
    for r in range(n):
        g, src = want[r], place[r]
        if g == src or mem[g] + memory_shares[r] > 1.0 + SUM_TOL or sm[g] + sm_need[r] > 1.0 + SUM_TOL:
            continue
        mem[src] -= memory_shares[r]
        sm[src] -= sm_need[r]
        mem[g] += memory_shares[r]
        sm[g] += sm_need[r]
        place[r] = g
    return place


def memory_shares(pool: Any) -> tuple[float, ...]:
    """Every instance's memory share (the part of its GPU's usable memory it reserved when first placed; it moves
    with the instance), read from the compiled loop's state when it runs the pool."""
    return tuple(device_state(pool).replica_mem_share.tolist())


def replica_terms(env: Any) -> tuple[tuple[float, ...], tuple[bool, ...]]:
    """Each instance's minimum SM share and whether it can move (its profile has cold-start figures), in the
    layout's order (GPU by GPU); cached on the env."""
    cached = getattr(env, "_replica_terms_cache", None)
    if cached is None or cached[0] is not env.layout:
        profs = [env.profiles[inst.model] for insts in env.layout.gpus for inst in insts]
        cached = (env.layout, tuple(float(p.sm_share.min_share) for p in profs),
                  tuple(p.latencies.load_s is not None for p in profs), tuple(p.name for p in profs))
        env._replica_terms_cache = cached
    return cached[1], cached[2]


def _profile_name(env: Any, replica: int) -> str:
    replica_terms(env)
    return env._replica_terms_cache[3][replica]


def check_shared_action(env: Any, action: Any) -> SharedConfig:
    """A shared pool's action as the configuration to apply; ValueError naming the field, element and range
    expected, before anything applies (the env is unchanged when it raises).

    ``active`` per model and ``clock`` are required; ``clocks`` per GPU replaces ``clock`` GPU by GPU. SM shares:
    ``share_weights`` (the space's form, mapped by `shares_from_weights`) or ``shares`` (exact, each in
    min_share..1, a GPU's sum <= 1); absent: they stay. Placement: ``gpu_request`` (the space's form, decoded by
    `placement_from_request`) or ``placement`` (exact GPU per instance, memory checked); absent: it stays.
    ``migrate`` (index into `MIGRATE_MODES`): what this action's moves do with running requests."""
    keys = SHARED_KEYS
    if not isinstance(action, dict) or "active" not in action or "clock" not in action:
        raise ValueError(f"action: expected a dict with keys 'active' (per model) and 'clock', optionally "
                         f"'clocks' (per GPU), 'share_weights' or 'shares' and 'gpu_request' or 'placement' (per "
                         f"instance) and 'migrate', got {action!r}")
    extra = sorted(str(k) for k in action if k not in keys)
    if extra:
        raise ValueError(f"action: unknown key(s) {', '.join(extra)}; a shared pool's action has {', '.join(keys)}")
    for exact, mapped in (("shares", "share_weights"), ("placement", "gpu_request")):
        if exact in action and mapped in action:
            raise ValueError(f"action: '{exact}' (exact) and '{mapped}' (the action space's mapped form) set the same "
                             f"thing; give one of them")

    def ints(key: str, n: int) -> list[int]:
        v = np.asarray(action[key])
        if v.ndim == 0:
            v = v.reshape(1)
        if v.shape != (n,) or v.dtype == bool or not np.issubdtype(v.dtype, np.integer):
            raise ValueError(f"action['{key}']: expected {n} integers (a float, even a whole one, is not in the "
                             f"MultiDiscrete space), got {action[key]!r}")
        return [int(x) for x in v]

    def floats(key: str, n: int, what: str) -> list[float]:
        raw = action[key]
        try:
            v = None if isinstance(raw, (str, bytes)) else np.asarray(raw, dtype=float)
        except (TypeError, ValueError):
            v = None
        if v is None or v.shape != (n,) or not np.all(np.isfinite(v)):
            raise ValueError(f"action['{key}']: expected {n} finite numbers ({what}), got {raw!r}")
        return [float(x) for x in v]

    nl = len(env.clocks_mhz)
    n, n_gpus = env.n_replicas, env.n_gpus
    active = ints("active", len(env.profiles))
    low = 0 if env.scale_to_zero else 1
    for m, (a, k) in enumerate(zip(active, env.replicas_per_model)):
        if not low <= a <= k:
            raise ValueError(f"action['active'][{m}]: expected {low}..{k} instances of model "
                             f"'{env.model_names[m]}', got {a}")
    (clock,) = ints("clock", 1)
    if not 0 <= clock < nl:
        raise ValueError(f"action['clock']: expected a level index 0..{nl - 1} (levels {env.clocks_mhz} MHz), "
                         f"got {clock}")
    clocks = ints("clocks", n_gpus) if "clocks" in action else [clock] * n_gpus
    for g, c in enumerate(clocks):
        if not 0 <= c < nl:
            raise ValueError(f"action['clocks'][{g}]: expected a level index 0..{nl - 1}, got {c}")
    migrate = "none"
    if "migrate" in action:
        (mi,) = ints("migrate", 1)
        if not 0 <= mi < len(MIGRATE_MODES):
            raise ValueError(f"action['migrate']: expected 0..{len(MIGRATE_MODES) - 1} "
                             f"({', '.join(MIGRATE_MODES)}), got {mi}")
        migrate = MIGRATE_MODES[mi]
    mins, movable = replica_terms(env)
    exact = weights = None
    if "shares" in action:
        exact = floats("shares", n, "the SM share of every instance")
        for r, x in enumerate(exact):
            if not mins[r] - 1e-12 <= x <= 1.0:
                raise ValueError(f"action['shares'][{r}]: expected {mins[r]}..1.0, got {x}")
    if "share_weights" in action:
        weights = floats("share_weights", n, "a weight in [0, 1] for every instance")
        for r, x in enumerate(weights):
            if not 0.0 <= x <= 1.0:
                raise ValueError(f"action['share_weights'][{r}]: expected a weight in 0.0..1.0 (the Box of the "
                                 f"action space), got {x}")
    current = list(env.shared_cfg.gpus)
    gpus = current
    if "placement" in action:
        gpus = ints("placement", n)
        for r, g in enumerate(gpus):
            if not 0 <= g < n_gpus:
                raise ValueError(f"action['placement'][{r}]: expected a GPU index 0..{n_gpus - 1}, got {g}")
            if g != current[r] and not movable[r]:
                raise ValueError(f"action['placement'][{r}]: moving it needs cold-start figures "
                                 f"(latencies.load_s, load_w) in profile {_profile_name(env, r)}")
    elif "gpu_request" in action:
        request = ints("gpu_request", n)
        for r, q in enumerate(request):
            if not 0 <= q <= n_gpus:
                raise ValueError(f"action['gpu_request'][{r}]: expected 0 (stay) or 1..{n_gpus} (GPU index + 1), "
                                 f"got {q}")
        need = mins if weights is not None else exact if exact is not None else env.shared_cfg.shares
        gpus = placement_from_request(request, current, n_gpus, memory_shares(env.pool), need, movable)
    shares = list(env.shared_cfg.shares)
    if exact is not None:
        shares = exact
    elif weights is not None:
        try:
            shares = shares_from_weights(weights, gpus, mins, n_gpus)
        except ValueError as e:
            raise ValueError(f"action['placement']: {e}") from None
    for g in range(n_gpus):
        tot = sum(x for x, gg in zip(shares, gpus) if gg == g)
        if tot > 1.0 + SUM_TOL:
            raise ValueError(f"action['shares'/'placement']: the instances on GPU {g} would get {tot:.3f} > 1 of "
                             f"its SMs")
    if "placement" in action or gpus != current:  # checked before anything applies: a refused move changes nothing
        env.pool.check_memory(dict(enumerate(gpus)), set(gpus))
    return SharedConfig(tuple(active), tuple(clocks), tuple(shares), tuple(gpus), migrate)
