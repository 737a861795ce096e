"""Hourly energy commitments E*_h of a scenario, frozen before any controller runs.

An energy-only scenario (``commitment: {energy_only: true}``) has no commitment: E*_h = 0 for every hour (every
hour's energy is billed) and no reference run is ever made. Absolute commitments (``commitment.mj``) are used as
given. Fractional ones (``commitment.fractions``) scale
the hourly energy of a *reference run*: full-capacity vLLM, i.e. all ``pool.gpus`` replicas active at the
profile's reference clock for the whole horizon (:func:`commitenv.sim.fixed.run_fixed`), serving the
scenario's workload built with ``commitment.reference.workload_seed`` (null: the evaluation workload itself,
as in the ePACT single-hour study; another seed: the paper's historical preceding Saturday, ePACT App. C.2)
under engine seed 0, with the scenario's ``engine`` settings (context limit, prefix caching). A trace workload
has no seed to redraw: its historical hour/day is another window of the same trace, starting at
``commitment.reference.start_hour`` (null: the evaluation window ``workload.start_hour``).

Reference runs are cached on disk by a content hash of everything that determines them (the profile file's
bytes, the workload spec and the resolved seed, a trace file's or a synthetic lengths file's bytes, the reference
window's start hour, pool size, horizon, interval, SLO scale, noise, the ``engine`` settings given, the realism
components, package version, :data:`CACHE_FORMAT` and a hash of the engine's source code, so that a number
computed by other code is never reused; scenario fields left unset add nothing) in ``$COMMITENV_CACHE/references/<hash>.json`` or, without
that variable, ``~/.cache/commitenv/references/<hash>.json``. Files are written atomically (temporary file,
then ``os.replace``); an unreadable or inconsistent file is recomputed, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
import warnings
from functools import lru_cache
from pathlib import Path

import numpy as np

from commitenv.scenarios.build import (
    engine_options,
    realism_of,
    reference_workload,
    scenario_layout,
    scenario_profile,
    scenario_profile_path,
    scenario_profiles,
    scenario_tenant_model,
    synthetic_lengths_path,
    with_tenant_mix,
)
from commitenv.scenarios.schema import Scenario, ScenarioError

CACHE_FORMAT = 1
REFERENCE_ENGINE_SEED = 0


def cache_root() -> Path:
    """Root of commitenv's on-disk cache: ``$COMMITENV_CACHE``, else ``$XDG_CACHE_HOME/commitenv``, else
    ``~/.cache/commitenv``."""
    env = os.environ.get("COMMITENV_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "commitenv"


def reference_workload_seed(sc: Scenario) -> int:
    """Seed of the reference run's workload: ``commitment.reference.workload_seed``, or the evaluation
    workload's own ``workload.seed`` when that is null. A trace workload takes no ``reference.workload_seed``
    (the schema rejects it); its seed only drives ``workload.rate_scale`` sampling: ``workload.seed``, or 0 when
    that is null."""
    ref = sc.commitment.reference
    if sc.workload.trace is not None:
        if ref is not None and ref.workload_seed is not None:
            raise ScenarioError(
                f"{sc.source}: commitment.reference.workload_seed: a trace workload has no seed to redraw, so the "
                "reference would silently be the same trace; for the historical hour/day use "
                "commitment.reference.start_hour (the start of another window of the same trace)"
            )
        return int(sc.workload.seed) if sc.workload.seed is not None else 0
    s = ref.workload_seed if ref is not None and ref.workload_seed is not None else sc.workload.seed
    if s is None:
        raise ScenarioError(
            f"{sc.source}: commitment.reference.workload_seed: expected an integer when workload.seed is null"
        )
    return int(s)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_ENGINE_PACKAGES = ("sim", "workload", "profiles", "scenarios")  # what a reference run executes


def source_sha256(root: Path, packages: tuple[str, ...] = _ENGINE_PACKAGES) -> str:
    """Hash of the ``*.py`` files of ``packages`` under ``root``, each package's subpackages (``sim/kernel``) after
    it (names and bytes, in a fixed order; a folder listed twice counts once)."""
    h = hashlib.sha256()
    seen: set[Path] = set()
    for pkg in packages:
        top = root / pkg
        subs = sorted({p.parent for p in top.rglob("*.py")} - {top})
        for folder, name in [(top, pkg), *((d, str(d.relative_to(root))) for d in subs)]:
            if folder.resolve() in seen:
                continue
            seen.add(folder.resolve())
            for path in sorted(folder.glob("*.py")):
                h.update(f"{name}/{path.name}\0".encode())
                h.update(path.read_bytes())
    return h.hexdigest()


@lru_cache(maxsize=1)
def engine_code_sha256() -> str:
    """`source_sha256` of this installation's engine, workload, profile and scenario packages: a cached
    reference made by other code has another key."""
    return source_sha256(Path(__file__).resolve().parents[1])


def reference_inputs(sc: Scenario) -> dict:
    """Everything the reference run's numbers depend on, as a JSON-able dict (hashed into the cache key)."""
    from commitenv._version import __version__

    wl = sc.workload.model_dump(mode="json")
    wl["seed"] = reference_workload_seed(sc)
    if sc.workload.trace is not None:
        wl["trace"] = {"sha256": _sha256_file(Path(sc.workload.trace).expanduser())}  # content, not location
    if sc.workload.tenant_mix is None:
        del wl["tenant_mix"]  # absent from one-model scenarios' keys
    if sc.workload.route is None:
        del wl["route"]  # absent from unrouted scenarios' keys
    if sc.workload.synthetic is None:
        del wl["synthetic"]  # absent from older scenarios' keys
    else:
        lpath = synthetic_lengths_path(sc)
        if lpath is not None:
            wl["synthetic"]["lengths"] = {"sha256": _sha256_file(lpath)}
    ref_start = reference_start_hour(sc)
    if ref_start is not None:
        wl["start_hour"] = ref_start  # the reference window (the evaluation window plays no part)
    engine = sc.engine.overrides()
    return {
        "cache_format": CACHE_FORMAT,
        "package_version": __version__,
        "engine_code_sha256": engine_code_sha256(),
        "profile_sha256": _sha256_file(scenario_profile_path(sc)),
        **({"pool": {"models": [{"name": m.name, "tenants": list(m.tenants),
                                 "profile_sha256": _sha256_file(scenario_profile_path(sc, m.profile))}
                                for m in sc.pool.models],
                     "placement": [[i.model_dump(mode="json") for i in g] for g in sc.pool.placement]}}
           if sc.pool.shared else {}),
        "workload": wl,
        "gpus": sc.pool.gpus,
        "horizon_hours": sc.horizon_hours,
        "interval_s": float(sc.interval_s),
        "alpha": float(sc.alpha),
        "noise": {"time_sigma": float(sc.noise.time_sigma), "energy_sigma": float(sc.noise.energy_sigma)},
        "engine_seed": REFERENCE_ENGINE_SEED,
        **_realism_inputs(sc),
        **({"engine": engine} if engine else {}),
    }


def reference_start_hour(sc: Scenario) -> float | None:
    """Start hour of a trace workload's reference window (``commitment.reference.start_hour``), or None: the
    evaluation window's."""
    ref = sc.commitment.reference
    return float(ref.start_hour) if ref is not None and ref.start_hour is not None else None


def _realism_inputs(sc: Scenario) -> dict:
    """The realism components a reference run depends on (none at ``ideal``, so its cache keys stay as they were)."""
    from commitenv.scenarios.build import realism_of

    r = realism_of(sc)
    if r.level == "ideal" and sc.realism.model_dump(exclude_unset=True).keys() <= {"level"}:
        return {}
    return {"realism": {k: (v.model_dump(mode="json") if hasattr(v, "model_dump") else v)
                        for k, v in r.model_dump(mode="json").items() if k != "planning_delay"}}


def _hash(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def reference_key(sc: Scenario) -> str:
    """Content hash (sha256 hex) naming the scenario's reference run in the cache."""
    return _hash(reference_inputs(sc))


def reference_cache_path(sc: Scenario) -> Path:
    """Where the scenario's reference run is (or would be) cached."""
    return cache_root() / "references" / f"{reference_key(sc)}.json"


def _read_cache(path: Path, key: str, hours: int) -> np.ndarray | None:
    """The cached hourly energies, or None when absent or not trustworthy (wrong key/format/shape/values)."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        ok = (
            isinstance(doc, dict)
            and doc.get("cache_format") == CACHE_FORMAT
            and doc.get("key") == key
            and isinstance(doc.get("hourly_energy_j"), list)
            and len(doc["hourly_energy_j"]) == hours
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in doc["hourly_energy_j"])
        )
        if ok:
            arr = np.asarray(doc["hourly_energy_j"], dtype=np.float64)
            if np.all(np.isfinite(arr)) and np.all(arr > 0):
                return arr
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    warnings.warn(f"reference cache file {path} is unreadable or inconsistent; recomputing it", RuntimeWarning,
                  stacklevel=3)
    return None


def _write_cache(path: Path, doc: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:  # a read-only home must not stop a run; the numbers are simply not kept
        warnings.warn(f"could not write the reference cache {path}: {e}", RuntimeWarning, stacklevel=3)


def compute_reference(sc: Scenario, *, progress: bool = False) -> dict:
    """Run full-capacity vLLM for the scenario's reference (no cache); returns the cache document."""
    from commitenv.sim.fixed import run_fixed

    seed = reference_workload_seed(sc)
    table = reference_workload(sc, seed, reference_start_hour(sc))
    prof = scenario_profile(sc)
    opts = engine_options(sc, REFERENCE_ENGINE_SEED)  # what the controller would see plays no part in vLLM
    t = time.perf_counter()
    if sc.pool.shared:  # every instance at its placed share, top clock: the MuxServe-like default (`vllm`)
        table = with_tenant_mix(sc, table, seed)
        res = run_fixed(scenario_profiles(sc), table, layout=scenario_layout(sc),
                        tenant_model=scenario_tenant_model(sc, table), options=opts, hours=sc.horizon_hours,
                        interval_s=sc.interval_s, progress=progress)
    else:
        res = run_fixed(prof, table, n_gpus=sc.pool.gpus, active=None, clock_mhz=None, options=opts,
                        hours=sc.horizon_hours, interval_s=sc.interval_s, progress=progress)
    settle = 1.0 + realism_of(sc).meters.pool_overhead  # commitments are bought on the meter that settles them
    return {
        "cache_format": CACHE_FORMAT,
        "scenario": sc.name,
        "profile": prof.name,
        "clock_mhz": prof.reference_clock_mhz,
        "active": sc.pool.gpus,
        "requests": int(len(table)),
        **({"reference_start_hour": reference_start_hour(sc)} if reference_start_hour(sc) is not None else {}),
        "hourly_energy_j": [float(v) * settle for v in res.hourly_energy_j],
        "hourly_attainment": [float(v) for v in res.hourly_attainment],
        "attainment": float(res.attainment),
        "wall_s": round(time.perf_counter() - t, 3),
    }


def reference_hourly_energy_j(sc: Scenario, *, use_cache: bool = True, progress: bool = False) -> np.ndarray:
    """Hourly energy (J) of the scenario's reference run, from the cache when a trustworthy entry exists."""
    if sc.commitment.fractions is None:
        raise ScenarioError(f"{sc.source}: commitment.fractions: absolute 'mj' commitments and energy-only scenarios "
                            "have no reference run")
    inputs = reference_inputs(sc)
    key = _hash(inputs)
    path = cache_root() / "references" / f"{key}.json"
    if use_cache:
        cached = _read_cache(path, key, sc.horizon_hours)
        if cached is not None:
            return cached
    doc = compute_reference(sc, progress=progress)
    e = np.asarray(doc["hourly_energy_j"], dtype=np.float64)
    if not (np.all(np.isfinite(e)) and np.all(e > 0)):
        raise ScenarioError(f"{sc.source}: commitment.reference: reference run gave non-positive hourly energy {e}")
    if use_cache:
        _write_cache(path, {**doc, "key": key, "inputs": inputs})
    return e


def commitments_mj(sc: Scenario, *, use_cache: bool = True, progress: bool = False) -> np.ndarray:
    """Hourly commitments E*_h in MJ, one per hour of the horizon (a single given value is used for every hour).

    Absolute ``mj`` values are returned as given; ``fractions`` multiply the reference run's hourly energy;
    ``energy_only`` gives zeros (no commitment; no reference run is made). The result is a read-only array:
    commitments are frozen before any controller runs.
    """
    c = sc.commitment
    H = sc.horizon_hours
    if c.energy_only:
        out = np.zeros(H, dtype=np.float64)
        out.setflags(write=False)
        return out
    if c.mj is not None:
        out = np.broadcast_to(np.asarray(c.mj, dtype=np.float64), (H,)).copy()
    else:
        ref_mj = reference_hourly_energy_j(sc, use_cache=use_cache, progress=progress) / 1e6
        frac = np.broadcast_to(np.asarray(c.fractions, dtype=np.float64), (H,))
        out = frac * ref_mj
    if not all(math.isfinite(v) and v > 0 for v in out):
        raise ScenarioError(f"{sc.source}: commitment: expected positive finite hourly commitments, got {out}")
    out.setflags(write=False)
    return out
