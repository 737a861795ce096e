"""A site router whose split is an action (a route under ``control: action``): it holds the route's workload of the
episode and each request's draw, and each interval hands every pool of the route its share of the interval's
arrivals under the split the action sets; the pools take them as they come (`CommitServeEnv.extend_workload`)."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from commitenv.scenarios.build import route_shares, route_stream
from commitenv.scenarios.schema import Scenario
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

    def hand_out(self, t_end: float, split: np.ndarray) -> list[RequestTable]:
        """Each pool's share (in ``pools`` order) of the requests not yet handed out that arrive before ``t_end``."""
        lo = self.next_row
        hi = len(self.table) if t_end == np.inf else int(np.searchsorted(self.table.arrival_s, t_end, side="left"))
        self.next_row = max(lo, hi)
        share = route_shares(self.u[lo:hi], split)
        return [select_rows(self.table, lo + np.flatnonzero(share == j)) for j in range(len(self.pools))]
