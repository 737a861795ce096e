"""Turn a :class:`Scenario` into the engine's inputs: the profile, the request table served, and the
engine options (SLO scale, noise, what the controller sees, seed)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from commitenv._paths import data_dir
from commitenv.profiles import ProfileError, load_profile
from commitenv.profiles.schema import Profile
from commitenv.scenarios.loader import ScenarioError
from commitenv.scenarios.schema import Scenario
from commitenv.sim.noise import NoiseSpec
from commitenv.sim.pool import EngineOptions
from commitenv.workload import RequestTable, WorkloadError, builtin_workload, load_trace, scale_rate, time_window


def _is_path(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml")) or "/" in ref or "\\" in ref


def scenario_profile_path(sc: Scenario) -> Path:
    """The profile file the scenario names (a shipped profile name or a path)."""
    ref = sc.pool.profile
    path = Path(ref).expanduser() if _is_path(ref) else data_dir("profiles") / f"{ref}.yaml"
    if not path.is_file():
        raise ScenarioError(f"{sc.source}: pool.profile: profile '{ref}' not found (looked at {path})")
    return path


def scenario_profile(sc: Scenario) -> Profile:
    """The scenario's GPU x model profile."""
    try:
        return load_profile(str(scenario_profile_path(sc)))
    except ProfileError as e:
        raise ScenarioError(f"{sc.source}: pool.profile: {e}") from None


def workload_seed(sc: Scenario, seed: int | None) -> int:
    """Seed of the built-in generator (and of rate scaling): ``workload.seed``, or the run seed when null."""
    s = sc.workload.seed if sc.workload.seed is not None else seed
    if s is None:
        raise ScenarioError(f"{sc.source}: workload.seed: null (use the run seed), but no run seed was given")
    return int(s)


def _readonly(table: RequestTable) -> RequestTable:
    for a in (table.arrival_s, table.prompt_tokens, table.output_tokens, table.tenant, table.request_id,
              table.prefix_offsets, table.prefix_hashes):
        if a is not None:
            a.setflags(write=False)
    return table


@lru_cache(maxsize=2)
def _builtin_source(name: str, seed: int) -> RequestTable:
    # the whole generated source, kept read-only; windows below are fresh copies
    return _readonly(builtin_workload(name, seed))


@lru_cache(maxsize=2)
def _trace_source(path: str, mtime_ns: int, size: int) -> RequestTable:
    return _readonly(load_trace(path))


def _source_table(sc: Scenario, seed: int) -> RequestTable:
    wl = sc.workload
    try:
        if wl.builtin is not None:
            return _builtin_source(wl.builtin, seed)
        path = Path(wl.trace).expanduser()
        if not path.is_file():
            raise ScenarioError(f"{sc.source}: workload.trace: trace file '{wl.trace}' not found")
        st = path.stat()
        return _trace_source(str(path.resolve()), st.st_mtime_ns, st.st_size)
    except WorkloadError as e:
        field = "workload.builtin" if wl.builtin is not None else "workload.trace"
        raise ScenarioError(f"{sc.source}: {field}: {e}") from None


def scenario_workload(sc: Scenario, seed: int | None = None) -> RequestTable:
    """The requests the scenario serves: the built-in generator (seeded by ``workload.seed``, or ``seed`` when
    that is null) or the trace, windowed to ``[start_hour, start_hour + horizon_hours)`` and rebased so the
    window starts at time 0, then rate-scaled by ``workload.rate_scale`` (seeded the same way)."""
    s = workload_seed(sc, seed)
    src = _source_table(sc, s)
    wl = sc.workload
    t0 = wl.start_hour * 3600.0
    t1 = t0 + sc.horizon_hours * 3600.0
    # the source's span in whole hours: a generator's hour count, else the trace's last arrival rounded up
    counts = src.meta.get("hourly_counts")
    span_h = len(counts) if counts else int(np.ceil(src.duration_s / 3600.0 - 1e-9))
    what = f"built-in '{wl.builtin}'" if wl.builtin is not None else f"trace '{wl.trace}'"
    if len(src) == 0 or t1 > span_h * 3600.0 + 1e-6:
        raise ScenarioError(
            f"{sc.source}: workload.start_hour: the window [{wl.start_hour:g} h, {t1 / 3600:g} h) runs past the end "
            f"of the {what}, which spans {span_h} h; expected start_hour + horizon_hours <= {span_h}"
        )
    table = time_window(src, t0, t1, rebase=True)
    if wl.rate_scale != 1.0:
        table = scale_rate(table, wl.rate_scale, seed=s)
    table.meta["scenario"] = sc.name
    table.meta["workload_seed"] = s
    return table


def engine_options(sc: Scenario, seed: int = 0) -> EngineOptions:
    """Engine options of a run with run seed ``seed``: SLO scale, truth-vs-prediction noise, what the controller
    sees (oracle lengths or predictions with log-normal error)."""
    return EngineOptions(
        alpha=float(sc.alpha),
        noise=NoiseSpec(time_sigma=sc.noise.time_sigma, energy_sigma=sc.noise.energy_sigma),
        seed=int(seed),
        length_error_sigma=float(sc.observation.length_error_sigma),
        oracle_lengths=sc.observation.lengths == "oracle",
    )
