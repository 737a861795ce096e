"""Run a site episode with one controller per pool, each pool tracking its own commitment (``budget="own"``) or a
share of the site's (``budget="site"``: a coordinator reallocates the site's remaining commitment among the pools
at every interval), in this process or sharded over Ray actors, and summarise it: the site's bill, each pool's
outcome and gate.

The coordinator (``budget="site"``). Only the site meter is settled, so a pool that is ahead of its own commitment
need not catch up while another is behind. Before every decision it gives each pool the hour's budget

    B_i = M_i + w_i (E*_site - M_site),   w_i = max(E*_i - M_i, 0) / sum_j max(E*_j - M_j, 0)

(M: the hour's energy so far on the controllers' meters, E*_i: the pool's own commitment, its forecast share of
the site's; equal weights when every pool is past its own): the site's remaining commitment split in proportion to
what each pool still planned to use. The pool's controller sees ``B_i`` as ``info["commitment_j"]`` (and the
matching ``target_j``); nothing else changes, and it sees nothing of the other pools but its budget.

``budget="guarded"``: the same, except that a pool at risk (`at_risk`: its current arrival hour's known miss
fraction has reached ``GUARD`` (0.5) x its epsilon, or one of its live requests is past its visible deadline) keeps its
own remaining commitment (``B_i = M_i + max(E*_i - M_i, 0)``: no cut, no extra) and the other pools share what is
left of the site's (a pool near its gate is not asked to cover another's overuse).

``budget="proportional"``: the site's remaining commitment split in proportion to each pool's draw in the hour so
far, ``B_i = M_i + (M_i / M_site) (E*_site - M_site)`` (before any draw, as ``site``): a pool's budget follows its load,
where a router moving requests between pools leaves the pools' own commitments behind.

Routers (a route under ``control: action``): this process holds the route's workload of the episode, and before
every interval a routing policy (``router``: ``fixed``, the file's split; ``efficient``,
`commitenv.site.router.EfficientSplit`) sets its split from the pools' reports; each pool is handed its share of the
interval's arrivals with its step call.

Sharding (``ray=ADDRESS``, ``shards=N``): the pools are split into N contiguous groups, each a Ray actor
(`commitenv.site.pools.PoolGroup`) holding its pools and their controllers; the actors step in lockstep, one call
per interval, and return per-pool reports only (`PoolReport`); this process keeps the site meter. The result is the
in-process run's, bit for bit (the same groups' code, the same seeds).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commitenv.scoring import gate_outcome
from commitenv.site.loader import Site, load_site
from commitenv.site.meter import SiteMeter
from commitenv.site.pools import PoolGroup, PoolReport, at_risk, route_seed  # noqa: F401 (at_risk: public here too)
from commitenv.site.router import ReplaySplit, Router, make_router_policy

BUDGETS = ("own", "site", "guarded", "proportional")


@dataclass
class SiteRun:
    """A finished site episode: the site's summary, its hourly bills, and every pool's summary
    (`commitenv.evaluation.score_episode`'s, on the pool's own commitment as if it settled alone)."""

    summary: dict[str, Any]
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)
    hours: list[dict[str, Any]] = field(default_factory=list)
    splits: dict[str, list[list[float]]] = field(default_factory=dict)  # each action route's weights per interval


def pool_specs(st: Site, controller: str) -> list[str]:
    """Each pool's controller spec: ``controller`` for every pool, or with ``SPEC@PATTERN+SPEC@PATTERN...`` the spec
    of the one pattern (fnmatch-style) the pool's name matches; ValueError naming a pool that matches none or two."""
    import fnmatch

    if "@" not in controller:
        return [controller] * len(st.pools)
    rules = []
    for part in controller.split("+"):
        spec, at, pattern = part.rpartition("@")
        if not at or not spec or not pattern:
            raise ValueError(f"controller {controller!r}: expected SPEC@PATTERN parts joined by '+', got {part!r}")
        rules.append((spec, pattern))
    out = []
    for p in st.pools:
        hits = [spec for spec, pattern in rules if fnmatch.fnmatchcase(p.name, pattern)]
        if len(hits) != 1:
            raise ValueError(f"controller {controller!r}: pool '{p.name}' matches {len(hits)} of the patterns "
                             f"{[pat for _, pat in rules]}; expected exactly one")
        out.append(hits[0])
    return out


def site_budgets(reports: list[PoolReport], site_commit_j: float, *, guarded: bool = False,
                 proportional: bool = False) -> list[float]:
    """Each pool's hour budget under the site coordinator (see the module docstring), in the reports' order;
    ``guarded``: a pool `at_risk` keeps its own remaining commitment (it is neither cut nor given more) and the others
    share the rest; ``proportional``: the site's remaining commitment split in proportion to what each pool has drawn
    in the hour so far (its own commitments' weights before it has drawn anything), so a budget follows a pool's load
    wherever a router sends it."""
    own = np.array([r.commitment_j for r in reports])
    used = np.array([r.hour_energy_j for r in reports])
    site_left = site_commit_j - math.fsum(used.tolist())
    if proportional and used.sum() > 0:
        return (used + used / used.sum() * site_left).tolist()
    left = np.maximum(own - used, 0.0)
    free = np.ones(len(reports), dtype=bool)
    if guarded:
        free = np.array([not at_risk(r) for r in reports])
        if not free.any():
            return (used + left).tolist()
        site_left -= math.fsum(left[~free].tolist())
    lf = np.where(free, left, 0.0)
    w = lf / lf.sum() if lf.sum() > 0 else free / free.sum()
    return np.where(free, used + w * site_left, used + left).tolist()


class _Local:
    """The pool groups in this process (the same calls as the Ray actors')."""

    def __init__(self, groups: list[PoolGroup]) -> None:
        self.groups = groups

    def call(self, method: str, args: list[tuple]) -> list[Any]:
        return [getattr(g, method)(*a) for g, a in zip(self.groups, args)]

    def close(self) -> None:
        pass


class _Ray:
    """The pool groups as Ray actors, one CPU each; every call goes to all of them and waits for all."""

    def __init__(self, ray, site: Site, shards: list[list[int]], specs: list[str], kwargs: dict, charge: bool) -> None:
        from commitenv.runner import ray_runtime_env

        self.ray = ray
        actor = ray.remote(num_cpus=1, runtime_env=ray_runtime_env())(PoolGroup)
        self.groups = [actor.remote(site, s, [specs[i] for i in s], kwargs, charge) for s in shards]

    def call(self, method: str, args: list[tuple]) -> list[Any]:
        return self.ray.get([getattr(g, method).remote(*a) for g, a in zip(self.groups, args)])

    def close(self) -> None:
        for g in self.groups:
            self.ray.kill(g)


def _shards(n_pools: int, n: int) -> list[list[int]]:
    n = max(1, min(n, n_pools))
    bounds = np.linspace(0, n_pools, n + 1).round().astype(int)
    return [list(range(bounds[i], bounds[i + 1])) for i in range(n)]


def run_site_episode(site: str | Site, controller: str, seed: int = 0, *, budget: str = "own",
                     controller_kwargs: dict[str, Any] | None = None, charge_planning: bool = True,
                     progress: bool = False, ray_address: str | None = None, shards: int = 1,
                     router: str = "fixed", replay_splits: dict[str, list[list[float]]] | None = None) -> SiteRun:
    """One site episode, ``controller`` (a registered name or spec, or ``SPEC@PATTERN+...``: `pool_specs`) running
    each pool; see the module docstring. ``ray_address`` (``"local"`` starts a local Ray) shards the pools over
    ``shards`` actors. ``router``: the policy (`commitenv.site.router.ROUTER_POLICIES`) that sets the split of every
    route under ``control: action`` each interval (this process holds those routes' workloads and hands each pool
    its share). ``replay_splits``: every route's splits of another run (`SiteRun.splits`) instead of a policy, so that
    each pool serves the same requests as there (a relative gate's reference for a routed run)."""
    from commitenv.registry import resolve

    if budget not in BUDGETS:
        raise ValueError(f"budget: expected one of {BUDGETS}, got {budget!r}")
    if not (isinstance(shards, int) and shards >= 1):
        raise ValueError(f"shards: expected an integer >= 1, got {shards!r}")
    st = site if isinstance(site, Site) else load_site(site)
    routers = [Router(r) for r in st.spec.routes if r.control == "action"]
    policies = [make_router_policy(router) if replay_splits is None else ReplaySplit(replay_splits[r.name])
                for r in routers]
    streamed = [p for r in routers for p in r.pools]
    specs = pool_specs(st, controller)
    name = resolve(controller).name if "@" not in controller else controller
    parts = _shards(len(st.pools), shards)
    kwargs = dict(controller_kwargs or {})
    started = False
    if ray_address is not None:
        from commitenv.runner import _ray_init, import_ray

        ray = import_ray("a site sharded on Ray")
        started = _ray_init(ray, ray_address, len(parts))
        groups: _Local | _Ray = _Ray(ray, st, parts, specs, kwargs, charge_planning)
    else:
        groups = _Local([PoolGroup(st, p, [specs[i] for i in p], kwargs, charge_planning) for p in parts])
    meter = SiteMeter(st.pool_names, st.commit_j, st.lambda_plus, st.lambda_minus, st.intervals_per_hour, seed=seed)
    steps = st.horizon_hours * st.intervals_per_hour
    bar = None
    t0 = time.perf_counter()
    try:
        reports = [r for rs in groups.call("reset", [(seed, streamed)] * len(parts)) for r in rs]
        index = {n: i for i, n in enumerate(st.pool_names)}
        for r, pol in zip(routers, policies):
            r.reset(st.pools[index[r.pools[0]]].scenario, route_seed(seed, r.name))
            pol.reset(r)
        splits: dict[str, list[list[float]]] = {r.name: [] for r in routers}  # each route's split per interval
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=steps, unit="interval", desc=f"{st.name} / {name}", leave=False)
        ret, misses, hours = 0.0, 0, []
        guarded = dict.fromkeys(st.pool_names, 0)  # decisions at which the guard kept a pool on its own budget
        for k in range(steps):
            b = None
            if budget != "own":
                b = site_budgets(reports, float(st.commit_j[k // st.intervals_per_hour]), guarded=budget == "guarded",
                                 proportional=budget == "proportional")
                if budget == "guarded":
                    for n, r in zip(st.pool_names, reports):
                        guarded[n] += int(at_risk(r))
            rows = {}
            by_name = dict(zip(st.pool_names, reports))
            for r, pol in zip(routers, policies):
                w = np.asarray(pol.weights(r, by_name), dtype=np.float64)
                splits[r.name].append(w.tolist())  # (the weights: a replay maps them to the same split)
                split = r.split(w)
                rows.update(r.hand_out(k, steps, st.interval_s, split))
            args: list[tuple] = [(None if b is None else [b[i] for i in p],
                                  {st.pool_names[i]: rows[st.pool_names[i]] for i in p if st.pool_names[i] in rows})
                                 for p in parts]
            reports = [r for rs in groups.call("step", args) for r in rs]
            booked = meter.record(np.array([r.settlement_meter_j for r in reports]))
            ret += booked.reward
            misses += sum(r.new_misses for r in reports)
            if booked.settlement is not None:
                hours.append(booked.settlement)
            if bar is not None:
                bar.update(1)
        tail_cost, _ = meter.finish(np.array([r.tail_energy_j for r in reports]))
        ret -= tail_cost
        wall = time.perf_counter() - t0
        pools: dict[str, dict[str, Any]] = {}
        for d in groups.call("summaries", [(wall,)] * len(parts)):
            pools.update(d)
        usage = groups.call("usage", [()] * len(parts))
    finally:
        if bar is not None:
            bar.close()
        groups.close()
        if started:
            ray.shutdown()
    summary = site_summary(st, meter, pools, controller=name, budget=budget, seed=seed, episode_return=ret,
                           wall_s=wall, shards=len(parts), usage=usage)
    if budget == "guarded":
        summary["guarded_decisions"] = guarded
    if routers:
        summary["router"] = router
        summary["route_splits"] = {n: np.mean([np.asarray(w) / np.sum(w) for w in v], axis=0).tolist()
                                   for n, v in splits.items()}  # the mean split over the intervals
    if summary["misses"] != misses:  # an invariant: by the end every miss has become known to the site
        raise RuntimeError(f"site run: the pools' records count {summary['misses']} misses, their steps reported {misses}")
    return SiteRun(summary, pools, hours, splits)


def site_summary(st: Site, meter: SiteMeter, pools: dict[str, dict[str, Any]], *, controller: str, budget: str,
                 seed: int, episode_return: float, wall_s: float, shards: int, usage: list) -> dict[str, Any]:
    """The site's summary of a finished episode from its meter and its pools' summaries."""
    s = meter.settlement
    summary = {
        "site": st.name, "controller": controller, "budget": budget, "seed": seed, "shards": shards,
        "cost_kwh_eq": float(math.fsum(s.cost_kwh.tolist()) + meter.tail_cost_kwh),
        "hours_cost_kwh_eq": float(s.cost_kwh.sum()), "tail_cost_kwh_eq": meter.tail_cost_kwh,
        "tail_energy_mj": meter.tail_energy_j / 1e6,
        "energy_mj": float(s.energy_j.sum() / 1e6),
        "commitment_mj": float(st.commit_j.sum() / 1e6),
        "mean_abs_dev_pct": float(np.mean(np.abs(s.energy_j / st.commit_j - 1.0)) * 100.0),
        "pools_alone_cost_kwh_eq": float(sum(p["cost_kwh_eq"] for p in pools.values())),
        "misses": int(sum(p["misses"] for p in pools.values())),
        "requests": int(sum(p["requests"] for p in pools.values())),
        "episode_return": episode_return, "wall_s": wall_s,
        "shard_usage": usage,  # per shard: its process's CPU s and peak RSS MB (in process: this process's)
    }
    summary["attainment_pct"] = 100.0 * (1 - summary["misses"] / max(summary["requests"], 1))
    return summary


def site_gates(run: SiteRun, lower: SiteRun | None) -> dict[str, Any]:
    """The site's gate: every pool passes its own scenario's gate (a relative one against the pool's run in
    ``lower``, the vLLM site run of the same seed). Returns {pool: {passed, failed_hours, shortfall_pct}} and
    ``passed`` overall."""
    out: dict[str, Any] = {}
    for n, s in run.pools.items():
        g = gate_outcome(s, None if lower is None else lower.pools[n])
        out[n] = {"passed": g.passed, "failed_hours": list(g.failed_hours), "shortfall_pct": g.shortfall_pct}
    return {"passed": all(v["passed"] for v in out.values()), "pools": out}
