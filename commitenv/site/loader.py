"""Find, read and check site files (``sites/*.yaml``): each pool's scenario with its overrides, and the site's
hourly commitment on the one meter. Every problem raises `SiteError` naming the file and the field."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from commitenv._paths import data_dir
from commitenv.scenarios.loader import (check_scenario, format_validation_error, parse_scenario, read_yaml,
                                        resolve_scenario)
from commitenv.scenarios.schema import Scenario, ScenarioError
from commitenv.site.schema import SiteError, SiteSpec


@dataclass(frozen=True)
class SitePool:
    """One pool of a loaded site: its name, its checked scenario (overrides applied; for a routed pool, its share of
    the route's workload in place of its own) and the route it serves (None: its own workload)."""

    name: str
    scenario: Scenario
    route: str | None = None


@dataclass(frozen=True)
class Site:
    """A loaded site: its pools (in file order; a ``count`` entry expanded) and the frozen hourly commitment (J) of
    the site meter, with the settlement rates shared by every pool."""

    spec: SiteSpec
    source: str
    pools: tuple[SitePool, ...]
    commit_j: np.ndarray
    lambda_plus: float
    lambda_minus: float

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def horizon_hours(self) -> int:
        return self.pools[0].scenario.horizon_hours

    @property
    def interval_s(self) -> float:
        return self.pools[0].scenario.interval_s

    @property
    def intervals_per_hour(self) -> int:
        return self.pools[0].scenario.intervals_per_hour

    @property
    def pool_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pools)


def sites_dir() -> Path | None:
    """The shipped ``sites/`` folder (wheel copy or checkout), or None when there is none."""
    try:
        return data_dir("sites")
    except FileNotFoundError:
        return None


def list_sites() -> list[str]:
    """Names of the shipped sites (file stems, which equal their ``name`` fields), sorted."""
    d = sites_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d is not None else []


def resolve_site(name_or_path: str | Path) -> tuple[Path, bool]:
    """The file behind a site name or path, and whether it is a shipped site."""
    s = str(name_or_path).strip()
    if isinstance(name_or_path, Path) or s.endswith((".yaml", ".yml")) or "/" in s or Path(s).is_file():
        return Path(s), False
    d = sites_dir()
    cand = d / f"{s}.yaml" if d is not None else None
    if cand is None or not cand.is_file():
        raise SiteError(f"{s}: unknown site; expected a YAML path or one of: {', '.join(list_sites()) or '(none shipped)'}")
    return cand, True


def _merge(base: dict, over: dict) -> dict:
    """``base`` with ``over``'s keys replaced; nested mappings merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _pool_scenario(spec_pool, where: str, base: Path, workload: dict | None = None) -> Scenario:
    """A pool's scenario: the file its ``scenario`` names (next to the site file first), its ``overrides`` merged,
    and its ``workload`` replaced by ``workload`` when given (a routed pool's share of its route)."""
    ref = spec_pool.scenario
    local = base / ref
    try:
        path, _ = (local, False) if local.is_file() else resolve_scenario(ref)
    except ScenarioError as e:
        raise SiteError(f"{where}.scenario: {e}") from None
    raw = read_yaml(path, SiteError)
    if not isinstance(raw, dict):
        raise SiteError(f"{where}.scenario: {path}: expected a mapping of scenario fields")
    src = f"{where} ({path}" + (" with the site's overrides" if spec_pool.overrides else "")
    merged = _merge(raw, spec_pool.overrides)
    if workload is not None:
        merged["workload"] = workload
        src += f" and its share of route '{workload['route']['name']}'"
    src += ")"
    try:
        sc = parse_scenario(merged, src)
        return check_scenario(sc, path.resolve().parent)
    except ScenarioError as e:
        raise SiteError(str(e)) from None


def _check_routes(src: str, spec: SiteSpec, pools: list[SitePool]) -> None:
    """Every route feeds pools of the same model (a request can go to any of them)."""
    from commitenv.scenarios.build import scenario_profiles

    by_name = {p.name: p for p in pools}
    for r in spec.routes:
        served: dict[str, str] = {}
        for n in r.split:
            served[n] = scenario_profiles(by_name[n].scenario)[0].model.name  # (shared pools refused before)
        if len(set(served.values())) > 1:
            raise SiteError(f"{src}: routes: route '{r.name}': its pools serve different models {served}; a route's "
                            f"requests must be servable by every pool it feeds")


def load_site(name_or_path: str | Path, *, use_cache: bool = True) -> Site:
    """Load and check a site: its pools' scenarios (overrides applied), that they step together (same horizon,
    interval and settlement rates), and its hourly commitment (a ``pools: sum`` commitment runs each pool's
    reference run once, then reads it from the cache)."""
    from commitenv.scenarios.commitments import commitments_mj

    path, shipped = resolve_site(name_or_path)
    src = str(path)
    raw = read_yaml(path, SiteError)
    if not isinstance(raw, dict):
        raise SiteError(f"{src}: expected a mapping of site fields at the top level, got {type(raw).__name__}")
    try:
        spec = SiteSpec.model_validate(raw)
    except ValidationError as e:
        raise SiteError(format_validation_error(src, e).replace("unknown field (not part of the scenario schema",
                                                                "unknown field (not part of the site schema")) from None
    if shipped and spec.name != path.stem:
        raise SiteError(f"{src}: name: expected '{path.stem}' (the file name), got '{spec.name}'")
    base = path.resolve().parent
    routed = {p: (r, list(r.split).index(p)) for r in spec.routes for p in r.split}
    pools: list[SitePool] = []
    for i, p in enumerate(spec.pools):
        names = [p.name] if p.count == 1 else [f"{p.name}-{j}" for j in range(p.count)]
        own = _pool_scenario(p, f"{src}: pools[{i}]", base)  # (shared by the entry's pools that are not routed)
        for n in names:
            if n in routed:
                r, k = routed[n]
                if own.pool.shared:
                    raise SiteError(f"{src}: routes: route '{r.name}': pool '{n}' serves several models "
                                    f"({[m.name for m in own.pool.models]}); a route feeds single-model pools")
                wl = {**r.workload, "route": {"name": r.name, "split": list(r.split.values()), "index": k}}
                pools.append(SitePool(n, _pool_scenario(p, f"{src}: pools[{i}] '{n}'", base, wl), r.name))
            else:
                pools.append(SitePool(n, own))
    _check_routes(src, spec, pools)
    first = pools[0].scenario
    for i, sp in enumerate(pools):
        sc = sp.scenario
        for field in ("horizon_hours", "interval_s", "lambda_plus", "lambda_minus"):
            if getattr(sc, field) != getattr(first, field) and not (field.startswith("lambda")
                                                                    and getattr(spec, field) is not None):
                raise SiteError(f"{src}: pools: pool '{sp.name}' has {field} {getattr(sc, field)} but pool "
                                f"'{pools[0].name}' has {getattr(first, field)}; a site's pools step and settle together")
    H = first.horizon_hours
    c = spec.commitment
    if c.mj is not None:
        vals = c.mj if isinstance(c.mj, list) else [c.mj]
        if len(vals) not in (1, H):
            raise SiteError(f"{src}: commitment.mj: expected one value or {H} (one per hour), got {len(vals)}")
        commit = np.broadcast_to(np.asarray(vals, dtype=np.float64) * 1e6, (H,)).copy()
    else:
        per_pool: dict[int, np.ndarray] = {}  # pools expanded from one entry share one scenario: computed once
        commit = np.zeros(H)
        for sp in pools:
            key = id(sp.scenario)
            if key not in per_pool:
                try:
                    mj = np.asarray(commitments_mj(sp.scenario, use_cache=use_cache), dtype=np.float64)
                except ScenarioError as e:
                    raise SiteError(f"{src}: pool '{sp.name}': {e}") from None
                per_pool[key] = np.broadcast_to(mj, (H,)) * 1e6
            commit = commit + per_pool[key]
        commit = commit * c.scale
        if not np.all(commit > 0):
            raise SiteError(f"{src}: commitment: 'pools: sum' needs pools with commitments (energy-only pools sum to 0)")
    commit.setflags(write=False)
    lp = spec.lambda_plus if spec.lambda_plus is not None else first.lambda_plus
    lm = spec.lambda_minus if spec.lambda_minus is not None else first.lambda_minus
    if not (math.isfinite(lp) and math.isfinite(lm)):
        raise SiteError(f"{src}: lambda_plus / lambda_minus: expected finite rates")
    return Site(spec=spec, source=src, pools=tuple(pools), commit_j=commit, lambda_plus=float(lp),
                lambda_minus=float(lm))
