"""Validated schema of a site file (``sites/*.yaml``): the pools behind one site meter and the site's commitment."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SiteError(ValueError):
    """A site is unknown, unreadable or invalid; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SitePoolSpec(_Strict):
    """One pool of the site: a pool scenario (shipped name or path, relative to the site file) whose fields
    ``overrides`` replaces (a nested mapping merged into the scenario file, validated as a scenario). ``count`` > 1
    stands for that many such pools, named ``<name>-0`` .. (each runs on its own seed, derived from the site's run
    seed and its name: a scenario whose ``workload.seed`` is null then draws each its own arrivals)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    scenario: str
    overrides: dict[str, Any] = Field(default_factory=dict)
    count: int = Field(default=1, ge=1, le=100_000)


class SiteRouteSpec(_Strict):
    """A site router: one stream of arrivals (``workload``, a scenario workload spec) split between pools that serve
    the same model, each request to pool p with probability ``split[p]`` (drawn per request, seeded by the route's
    workload seed and its name). A routed pool serves its share instead of its scenario's own workload; its own
    commitment (``pools: sum``) is then its scenario's reference run on its share of the route's reference workload."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    workload: dict[str, Any]
    split: dict[str, float] = Field(min_length=1)
    # fixed: every episode at ``split``; action: `SiteEnv`'s action sets the split of each coming interval
    # (``split`` is then the split of an all-zero action, and the one `commitenv site`'s runs use)
    control: Literal["fixed", "action"] = "fixed"

    @model_validator(mode="after")
    def _split(self) -> "SiteRouteSpec":
        bad = {p: v for p, v in self.split.items() if not 0.0 <= v <= 1.0}
        if bad:
            raise ValueError(f"routes: route '{self.name}': split: expected fractions in [0, 1], got {bad}")
        if abs(sum(self.split.values()) - 1.0) > 1e-9:
            raise ValueError(f"routes: route '{self.name}': split: fractions must sum to 1, got "
                             f"{sum(self.split.values()):.12g}")
        return self


class SiteCommitmentSpec(_Strict):
    """The hourly commitment on the site meter: ``pools`` (the sum of the pools' own commitments, each built as its
    scenario says, times ``scale``) or ``mj`` (absolute, one value or one per hour)."""

    pools: Literal["sum"] | None = None
    scale: float = Field(default=1.0, gt=0, le=2.0)
    mj: float | list[float] | None = None

    @model_validator(mode="after")
    def _one(self) -> "SiteCommitmentSpec":
        if (self.pools is None) == (self.mj is None):
            raise ValueError("commitment: give exactly one of 'pools: sum' or 'mj'")
        if self.mj is not None and self.scale != 1.0:
            raise ValueError("commitment.scale: only with 'pools: sum' (scale absolute 'mj' values yourself)")
        if self.mj is not None:
            vals = self.mj if isinstance(self.mj, list) else [self.mj]
            if not vals or any(not (v > 0) for v in vals):
                raise ValueError(f"commitment.mj: expected positive MJ values, got {self.mj}")
        return self


class SiteSpec(_Strict):
    """A site: pools stepping in lockstep (same horizon and interval), settled together on one meter.

    ``gate``: ``per_pool`` (every pool meets its own scenario's SLO gate in every arrival hour: a pool's users are
    its own, and a site-wide miss fraction would let one pool starve its users behind another's slack)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    description: str = ""
    pools: list[SitePoolSpec] = Field(min_length=1, max_length=100_000)
    commitment: SiteCommitmentSpec = SiteCommitmentSpec(pools="sum")
    lambda_plus: float | None = Field(default=None, gt=0)
    lambda_minus: float | None = Field(default=None, ge=0)
    gate: Literal["per_pool"] = "per_pool"
    routes: list[SiteRouteSpec] = Field(default_factory=list)
    sources: dict[str, str] = Field(default_factory=dict)  # where each parameter comes from (free text)

    @model_validator(mode="after")
    def _names(self) -> "SiteSpec":
        names = [n for p in self.pools for n in ([p.name] if p.count == 1 else
                                                   [f"{p.name}-{i}" for i in range(p.count)])]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"pools: pool names must be distinct, got {dup} more than once")
        if self.routes and "routes" in names:
            raise ValueError("pools: 'routes' names the routers' part of a site's action; give the pool another name")
        rnames = [r.name for r in self.routes]
        if len(set(rnames)) != len(rnames):
            raise ValueError(f"routes: route names must be distinct, got {rnames}")
        seen: dict[str, str] = {}
        for r in self.routes:
            for p in r.split:
                if p not in names:
                    raise ValueError(f"routes: route '{r.name}': split: unknown pool '{p}'; expected pools of this "
                                     f"site: {names}")
                if p in seen:
                    raise ValueError(f"routes: pool '{p}' is in routes '{seen[p]}' and '{r.name}'; a pool serves "
                                     f"one route at most")
                seen[p] = r.name
        return self
