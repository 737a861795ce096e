"""A site router whose split is an action (a route under ``control: action``): it holds the route's workload of the
episode and each request's draw, and each interval hands every pool of the route its share of the interval's
arrivals under the split the action sets; the pools take them as they come (`CommitServeEnv.extend_workload`)."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from commitenv.scenarios.build import route_shares, route_stream
from commitenv.scenarios.schema import Scenario
from commitenv.site.pools import PoolReport, at_risk
from commitenv.site.schema import SiteRouteSpec
from commitenv.workload import RequestTable, select_rows


class Router:
    """One route's router: ``pools`` in split order. The action is a weight per pool (a Box in [0, 1]); the split
    is the weights over their sum, or the file's ``split`` when all are 0, so every point of the space is a split."""

    def __init__(self, spec: SiteRouteSpec) -> None:
        self.name = spec.name
        self.pools = list(spec.split)
        self.default = np.array(list(spec.split.values()), dtype=np.float64)
        self.space = spaces.Box(0.0, 1.0, shape=(len(self.pools),), dtype=np.float32)

    def split(self, weights) -> np.ndarray:
        """The split an action's ``weights`` set (checked: one finite weight in [0, 1] per pool, else an error naming
        the route)."""
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (len(self.pools),) or not np.all(np.isfinite(w)) or np.any(w < 0) or np.any(w > 1):
            raise ValueError(f"action['routes']['{self.name}']: expected {len(self.pools)} weights in [0, 1] (pools "
                             f"{self.pools}), got {np.asarray(weights).tolist()}")
        total = w.sum()
        return self.default if total == 0 else w / total

    def reset(self, scenario: Scenario, seed: int) -> None:
        """The route's workload of the episode (``scenario``: a pool of the route; ``seed``: the route's workload
        seed), drawn once; none of it handed out yet."""
        self.table, self.u = route_stream(scenario, seed)
        self.next_row = 0

    def hand_out(self, k: int, steps: int, interval_s: float, split: np.ndarray) -> dict[str, RequestTable]:
        """Each pool's share of the requests not yet handed out that arrive before decision interval ``k`` (of
        ``steps``) ends; the last interval takes the rest."""
        lo = self.next_row
        hi = len(self.table) if k + 1 >= steps else int(np.searchsorted(self.table.arrival_s, (k + 1) * interval_s,
                                                                          side="left"))
        self.next_row = max(lo, hi)
        share = route_shares(self.u[lo:hi], split)
        return {p: select_rows(self.table, lo + np.flatnonzero(share == j)) for j, p in enumerate(self.pools)}


# ---------------------------------------------------------------------------------------------- routing policies
class FixedSplit:
    """Every interval at the route's file ``split`` (what a router blind to the pools does)."""

    name = "fixed"

    def reset(self, router: Router) -> None:
        pass

    def weights(self, router: Router, reports: dict[str, PoolReport]) -> np.ndarray:
        return router.default


class EfficientSplit:
    """Moves ``step`` of the split per interval towards the pool of the route that has drawn the least energy per
    arrived request so far (its settlement meter over its arrivals), while that pool is not at risk (its arrival
    hour's known misses under ``guard`` x its tolerance, no live request past its visible deadline); a pool at risk
    gives ``step`` back to the others. Every pool keeps at least ``min_share``. A baseline from what the pools report,
    not a planner."""

    name = "efficient"

    def __init__(self, step: float = 0.05, min_share: float = 0.1, guard: float = 0.5) -> None:
        if not (0 < step <= 1 and 0 <= min_share < 1 and 0 < guard <= 1):
            raise ValueError(f"efficient router: expected 0 < step <= 1, 0 <= min_share < 1, 0 < guard <= 1; got "
                             f"step={step}, min_share={min_share}, guard={guard}")
        self.step, self.min_share, self.guard = step, min_share, guard

    def reset(self, router: Router) -> None:
        self.split = router.default.copy()
        if self.min_share * len(router.pools) > 1:
            raise ValueError(f"efficient router: min_share {self.min_share} x {len(router.pools)} pools exceeds 1")

    def weights(self, router: Router, reports: dict[str, PoolReport]) -> np.ndarray:
        rep = [reports[p] for p in router.pools]
        if min(r.arrived for r in rep) == 0:
            return self.split  # (nothing to compare yet)
        per_req = np.array([r.settlement_meter_j / r.arrived for r in rep])
        risk = np.array([at_risk(r, self.guard) for r in rep])
        s = self.split.copy()
        for j in np.flatnonzero(risk):  # a pool at risk sheds load to the others
            give = min(self.step, s[j] - self.min_share)
            if give > 0 and (~risk).any():
                s[j] -= give
                s[~risk] += give / (~risk).sum()
        best = int(np.argmin(np.where(risk, np.inf, per_req)))
        if not risk[best]:  # the cheapest pool not at risk takes load from the others, each down to min_share
            others = np.arange(len(s)) != best
            room = np.clip(s - self.min_share, 0, None) * others
            take = min(self.step, room.sum())
            if take > 0:
                s -= take * room / room.sum()
                s[best] += take
        self.split = s / s.sum()
        return self.split


class ReplaySplit:
    """The splits of another run, interval by interval (the same requests reach each pool as there)."""

    name = "replay"

    def __init__(self, splits: list[list[float]]) -> None:
        self.splits = [np.asarray(s, dtype=np.float64) for s in splits]

    def reset(self, router: Router) -> None:
        self.k = 0

    def weights(self, router: Router, reports: dict[str, PoolReport]) -> np.ndarray:
        if self.k >= len(self.splits):
            raise ValueError(f"replay router: route '{router.name}' has {len(self.splits)} splits to replay, the run "
                             f"asked for more")
        self.k += 1
        return self.splits[self.k - 1]


ROUTER_POLICIES = {"fixed": FixedSplit, "efficient": EfficientSplit}


def make_router_policy(name: str):
    """A routing policy by name (`ROUTER_POLICIES`), an error naming the choices otherwise."""
    if name not in ROUTER_POLICIES:
        raise ValueError(f"router: expected one of {sorted(ROUTER_POLICIES)}, got {name!r}")
    return ROUTER_POLICIES[name]()
