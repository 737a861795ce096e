"""Turn a :class:`Scenario` into the engine's inputs: the profile (with the scenario's ``engine`` overrides), the
request table served (a built-in generator, a trace file or a ``workload.synthetic`` spec), and the engine options
(SLO scale, realism, what the controller sees, prefix caching, seed).

Seeds: a run seed ``s`` is what `reset(seed=s)` receives. Everything random in an episode comes from seeds
derived from it one way (`derived_seed`): the workload of a scenario whose ``workload.seed`` is null, the engine's
truth, and the seed a controller is given, so a controller's seed tells it nothing about the trace.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from commitenv._paths import data_dir
from commitenv.profiles import ProfileError, load_profile
from commitenv.profiles.schema import Profile
from commitenv.scenarios.realism import Realism
from commitenv.scenarios.schema import Scenario, ScenarioError
from commitenv.sim.noise import NoiseSpec
from commitenv.sim.pool import EngineOptions, Instance, PoolLayout
from commitenv.sim.truth import TruthSpec
from commitenv.workload import (
    EmpiricalLengths,
    RequestTable,
    WorkloadError,
    builtin_lengths,
    builtin_workload,
    load_trace,
    scale_rate,
    select_rows,
    time_window,
)
from commitenv.workload.builtin import builtin_window
from commitenv.workload.synthetic import synthesize_window, window_hours

_TAGS = {"workload": 0x776C, "controller": 0x6374, "arrivals": 0x6172, "tenants": 0x746E, "route": 0x7274}


def derived_seed(run_seed: int, purpose: str) -> int:
    """A 63-bit seed for ``purpose`` ('workload', 'controller', 'arrivals', 'tenants') derived one way from the run seed."""
    st = np.random.SeedSequence([int(run_seed), _TAGS[purpose]]).generate_state(2, dtype=np.uint32)
    return int((int(st[0]) << 31) ^ int(st[1])) & ((1 << 63) - 1)


def realism_of(sc: Scenario) -> Realism:
    """The scenario's realism with every component filled in (level preset + the file's overrides)."""
    return sc.realism.resolved()


def truth_spec(sc: Scenario, profile: Profile | None = None) -> TruthSpec | None:
    """The engine's truth model for the scenario's realism, or None when it adds nothing (``ideal``). The request
    overhead is ``overhead_s`` plus ``overhead_prefill_tokens`` at the profile's reference-clock prefill rate."""
    r = realism_of(sc)
    lat, gv = r.latency, r.gpu_variation
    overhead = lat.overhead_s
    if lat.overhead_prefill_tokens > 0:
        prof = profile or scenario_profile(sc)
        overhead += lat.overhead_prefill_tokens * prof.clocks[prof.reference_clock_index].time.tau1
    spec = TruthSpec(
        cell_s=lat.cell_s, time_sigma=lat.time_sigma, energy_sigma=lat.energy_sigma, speed_sigma=gv.speed_sigma,
        power_sigma=gv.power_sigma, power_bias=r.energy_model.bias, drift_time_sigma=gv.drift_time_sigma,
        drift_energy_sigma=gv.drift_energy_sigma, drift_tau_s=gv.drift_tau_s, straggler_prob=lat.straggler_prob,
        straggler_factor=lat.straggler_factor, overhead_s=overhead, overhead_cv=lat.overhead_cv,
    )
    null = TruthSpec(cell_s=spec.cell_s, drift_tau_s=spec.drift_tau_s, straggler_factor=spec.straggler_factor)
    return None if spec == null else spec


def _is_path(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml")) or "/" in ref or "\\" in ref


def scenario_profile_path(sc: Scenario, ref: str | None = None, field: str = "pool.profile") -> Path:
    """The profile file the scenario names (a shipped profile name or a path): ``pool.profile``, or ``ref``
    (a shared pool's model profile, named ``field`` in errors)."""
    ref = sc.pool.profile if ref is None else ref
    if ref is None:  # a shared pool: its first model's profile
        ref, field = sc.pool.models[0].profile, "pool.models[0].profile"
    path = Path(ref).expanduser() if _is_path(ref) else data_dir("profiles") / f"{ref}.yaml"
    if not path.is_file():
        raise ScenarioError(f"{sc.source}: {field}: profile '{ref}' not found (looked at {path})")
    return path


def scenario_profile(sc: Scenario) -> Profile:
    """The scenario's GPU x model profile (a shared pool: its first model's), with ``engine.context_limit`` and
    ``engine.reserve_full_sequence`` (when given) in place of the profile's (a re-validated copy: the limit must fit
    the profile's KV capacity). Also checks that ``engine.prefix_block_tokens`` is a multiple of the profile's KV
    block size."""
    return scenario_profiles(sc)[0]


def scenario_profiles(sc: Scenario) -> list[Profile]:
    """One profile per model of the pool (`scenario_profile` for a one-model pool), engine settings applied."""
    if not sc.pool.shared:
        return [_engine_profile(sc, scenario_profile_path(sc), "pool.profile")]
    return [_engine_profile(sc, scenario_profile_path(sc, m.profile, f"pool.models[{i}].profile"),
                            f"pool.models[{i}].profile") for i, m in enumerate(sc.pool.models)]


def _engine_profile(sc: Scenario, path: Path, field: str) -> Profile:
    try:
        prof = load_profile(str(path))
    except ProfileError as e:
        raise ScenarioError(f"{sc.source}: {field}: {e}") from None
    eng = sc.engine
    bs = prof.scheduler.block_size
    if eng.prefix_block_tokens is not None and eng.prefix_block_tokens % bs:
        raise ScenarioError(
            f"{sc.source}: engine.prefix_block_tokens: expected a multiple of the profile's scheduler.block_size "
            f"({bs} tokens, profile '{prof.name}'), got {eng.prefix_block_tokens}"
        )
    if eng.reserve_full_sequence is not None and eng.reserve_full_sequence != prof.scheduler.reserve_full_sequence:
        sch = prof.scheduler.model_copy(update={"reserve_full_sequence": eng.reserve_full_sequence})
        prof = prof.model_copy(update={"scheduler": sch})  # a bool: nothing else to re-check
    if eng.context_limit is None or eng.context_limit == prof.scheduler.context_limit:
        return prof
    return _with_context_limit(sc.source, prof, int(eng.context_limit))


def scenario_layout(sc: Scenario) -> PoolLayout:
    """Which model instances every GPU hosts, with their SM shares (one full-share replica per GPU for one model)."""
    if not sc.pool.shared:
        return PoolLayout.single(sc.pool.gpus)
    index = {m.name: i for i, m in enumerate(sc.pool.models)}
    return PoolLayout(tuple(tuple(Instance(index[i.model], float(i.share), i.kv_tokens) for i in g)
                            for g in sc.pool.placement))


def scenario_tenant_model(sc: Scenario, table: RequestTable) -> dict[int, int] | None:
    """The model serving each of ``table``'s tenants (by index), for `Pool.attach`; None for one model. A tenant
    no model serves is an error naming it."""
    if not sc.pool.shared:
        return None
    by_name = {t: i for i, m in enumerate(sc.pool.models) for t in m.tenants}
    out = {}
    present = set(np.unique(table.tenant).tolist()) if len(table) else set()
    for k, name in enumerate(table.tenant_names):
        if name in by_name:
            out[k] = by_name[name]
        elif k in present:
            raise ScenarioError(f"{sc.source}: pool.models: workload tenant '{name}' is served by no model")
    return out


def with_tenant_mix(sc: Scenario, table: RequestTable, seed: int) -> RequestTable:
    """``table`` with every request's tenant drawn from ``workload.tenant_mix`` (seeded; unchanged without one)."""
    mix = sc.workload.tenant_mix
    if mix is None:
        return table
    names = tuple(mix)
    p = np.array([mix[n] for n in names], dtype=np.float64)
    rng = np.random.default_rng(derived_seed(seed, "tenants"))
    tenant = rng.choice(len(names), size=len(table), p=p / p.sum()).astype(np.int32)
    return replace(table, tenant=tenant, tenant_names=names, meta=dict(table.meta))


def route_uniforms(seed: int, name: str, n: int) -> np.ndarray:
    """One uniform draw per request of a route's ``n`` requests, in arrival order, seeded by the workload's seed and
    the route's name (every pool of the route draws the same); a request goes to the share whose interval of the
    split's cumulative fractions holds its draw (`route_shares`)."""
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    st = np.random.SeedSequence([int(seed) & ((1 << 63) - 1), _TAGS["route"], key]).generate_state(2, dtype=np.uint32)
    return np.random.default_rng([int(x) for x in st]).random(n)


def route_shares(u: np.ndarray, split) -> np.ndarray:
    """The share (index into ``split``) of each request with draw ``u``."""
    return np.searchsorted(np.cumsum(np.asarray(split, dtype=np.float64))[:-1], u, side="right")


def with_route(sc: Scenario, table: RequestTable, seed: int) -> RequestTable:
    """``table`` narrowed to this pool's share of its route (``workload.route``; unchanged without one)."""
    r = sc.workload.route
    if r is None:
        return table
    rows = np.flatnonzero(route_shares(route_uniforms(seed, r.name, len(table)), r.split) == r.index)
    out = select_rows(table, rows)
    out.meta.update({"route": r.name, "route_share": r.index, "route_split": list(r.split)})
    return out


def route_stream(sc: Scenario, seed: int) -> tuple[RequestTable, np.ndarray]:
    """A routed scenario's whole route workload for run seed ``seed`` (before any split) and its requests' draws:
    what a router splits interval by interval (`commitenv.site`)."""
    if sc.workload.route is None:
        raise ScenarioError(f"{sc.source}: workload.route: the scenario is not routed")
    table, rs = _unrouted_workload(sc, seed)
    return table, route_uniforms(rs, sc.workload.route.name, len(table))


def _with_context_limit(source: str, prof: Profile, limit: int) -> Profile:
    sch = prof.scheduler.model_copy(update={"context_limit": limit})
    src = {**prof.sources, "scheduler.context_limit": f"scenario {source}: engine.context_limit = {limit} "
                                                      f"(profile: {prof.scheduler.context_limit})"}
    try:  # model_copy does not validate: re-validate the whole profile (KV capacity >= context limit)
        return Profile.model_validate(prof.model_copy(update={"scheduler": sch, "sources": src}).model_dump())
    except ValidationError as e:
        why = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors())
        raise ScenarioError(
            f"{source}: engine.context_limit: {limit} tokens does not fit profile '{prof.name}': {why}"
        ) from None


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


@lru_cache(maxsize=8)
def _lengths_file(path: str, mtime_ns: int, size: int) -> EmpiricalLengths:
    return EmpiricalLengths.from_json(path)


def synthetic_lengths_path(sc: Scenario) -> Path | None:
    """The lengths JSON a ``workload.synthetic`` names by path (relative: next to the scenario file first, then the
    current folder), or None for a shipped table or another source."""
    syn = sc.workload.synthetic
    if syn is None or not syn.lengths_is_path:
        return None
    p = Path(syn.lengths).expanduser()
    cands = [p]
    if not p.is_absolute() and sc._source is not None and Path(sc._source).is_file():
        cands = [Path(sc._source).resolve().parent / p, p]
    for c in cands:
        if c.is_file():
            return c.resolve()
    raise ScenarioError(f"{sc.source}: workload.synthetic.lengths: length table '{syn.lengths}' not found (looked at "
                        f"{' and '.join(str(c.absolute()) for c in cands)})")


def synthetic_lengths(sc: Scenario) -> EmpiricalLengths:
    """The length distribution of a ``workload.synthetic`` source, capped to its ``context_limit`` when given."""
    syn = sc.workload.synthetic
    try:
        path = synthetic_lengths_path(sc)
        if path is None:
            lengths = builtin_lengths(syn.lengths)
        else:
            st = path.stat()
            lengths = _lengths_file(str(path), st.st_mtime_ns, st.st_size)
    except WorkloadError as e:
        raise ScenarioError(f"{sc.source}: workload.synthetic.lengths: {e}") from None
    return lengths.with_context_limit(syn.context_limit) if syn.context_limit is not None else lengths


def synthetic_window(sc: Scenario, seed: int, start_hour: float, hours: int, *, rate_factors=None,
                     minute_shape=None, field: str = "workload.start_hour") -> RequestTable:
    """Hours ``[start_hour, start_hour + hours)`` of the scenario's ``workload.synthetic`` source, drawn with
    `synthesize` from ``seed`` and rebased to time 0, as `builtin_window` draws a built-in's: only the hours
    touched are generated (the neighbouring hours' levels shape a smooth intensity at the edges), every hour's
    count (or rate) times its ``rate_factors`` entry (one per hour touched), ``minute_shape`` (60 weights per hour
    touched) modulating arrivals within each hour. ``field`` names the start hour in errors."""
    syn = sc.workload.synthetic
    counts = syn.hourly_counts is not None
    levels = syn.hourly_counts if counts else syn.hourly_rates
    n = len(levels)
    h0, h1 = window_hours(start_hour, hours)
    if h0 < 0 or h1 > n:
        raise ScenarioError(
            f"{sc.source}: {field}: the window [{start_hour:g} h, {start_hour + hours:g} h) runs past the end of "
            f"workload.synthetic, which gives {n} hourly values; expected a window within [0 h, {n} h)"
        )
    try:
        out = synthesize_window(levels, counts=counts, start_hour=start_hour, hours=hours, lengths=synthetic_lengths(sc),
                                seed=int(seed), burstiness_cv=syn.burstiness_cv, smooth=syn.smooth,
                                rate_factors=rate_factors, minute_shape=minute_shape)
    except WorkloadError as e:
        raise ScenarioError(f"{sc.source}: workload.synthetic: {e}") from None
    out.meta["synthetic"] = True
    return out


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


def minute_modulation(r: Realism, hours: int, seed: int) -> np.ndarray | None:
    """Per-minute arrival-rate factors of an episode (log-normal, mean one, AR(1) over minutes), or None."""
    a = r.arrivals
    if a.minute_sigma <= 0:
        return None
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(60 * hours)
    x = np.empty_like(z)
    prev = rng.standard_normal()
    c = np.sqrt(1.0 - a.minute_corr ** 2)
    for i, zi in enumerate(z):
        prev = a.minute_corr * prev + c * zi
        x[i] = prev
    return np.exp(a.minute_sigma * x - 0.5 * a.minute_sigma ** 2)


def episode_workload(sc: Scenario, run_seed: int) -> RequestTable:
    """A fresh workload for one episode of a scenario whose ``workload.seed`` is null (see `WorkloadSpec`)."""
    wl = sc.workload
    ws = derived_seed(run_seed, "workload")
    rng = np.random.default_rng(ws)
    H = sc.horizon_hours
    if wl.synthetic is not None:  # drawn as a built-in episode is: per-hour factors, then the minute modulation
        h0, h1 = window_hours(wl.start_hour, H)
        factors = rng.uniform(1 - wl.rate_spread, 1 + wl.rate_spread, h1 - h0) * wl.rate_scale
        shape = minute_modulation(realism_of(sc), h1 - h0, derived_seed(run_seed, "arrivals"))
        table = synthetic_window(sc, ws, wl.start_hour, H, rate_factors=factors, minute_shape=shape)
        table.meta["scenario"] = sc.name
        table.meta["workload_seed"] = "derived from the run seed"
        return table
    shape = minute_modulation(realism_of(sc), H, derived_seed(run_seed, "arrivals"))
    try:
        if wl.builtin is not None:
            factors = rng.uniform(1 - wl.rate_spread, 1 + wl.rate_spread, H) * wl.rate_scale
            table = builtin_window(wl.builtin, ws, wl.start_hour, H, rate_factors=factors, minute_shape=shape)
        else:
            start = wl.start_hour + float(rng.uniform(0.0, wl.window_slack_h))
            src = _source_table(sc, 0)
            table = time_window(src, start * 3600.0, (start + H) * 3600.0, rebase=True)
            if len(table) == 0:
                raise ScenarioError(f"{sc.source}: workload: the trace window starting at {start:g} h is empty")
            _warn_if_trace_just_overruns(sc, src, (start + H) * 3600.0)
            if wl.rate_scale != 1.0:
                table = scale_rate(table, wl.rate_scale, seed=ws & 0x7FFF_FFFF)
    except WorkloadError as e:
        raise ScenarioError(f"{sc.source}: workload: {e}") from None
    table.meta["scenario"] = sc.name
    table.meta["workload_seed"] = "derived from the run seed"
    return table


def _warn_if_trace_just_overruns(sc: Scenario, src: RequestTable, end_s: float) -> None:
    """A trace whose last few requests arrive less than one horizon after the window ends was most likely meant to be
    served whole: say how many fall outside (not for a day trace windowed to an hour, a trace with more requests
    after the window than in it, or one whose later stretch is the commitment's reference window)."""
    after = src.arrival_s[src.arrival_s >= end_s]
    ref = sc.commitment.reference
    if ref is not None and ref.start_hour is not None:
        return
    if len(after) and after[-1] < end_s + sc.horizon_hours * 3600.0 and 2 * len(after) < len(src):
        warnings.warn(f"{sc.source}: workload: {len(after)} of the trace's {len(src)} requests arrive after the "
                      f"window ends ({end_s:g} s from the trace's first request; horizon_hours: {sc.horizon_hours}) "
                      "and are not served; lengthen horizon_hours or trim the trace", stacklevel=3)


def scenario_workload(sc: Scenario, seed: int | None = None) -> RequestTable:
    """The requests the scenario serves: the built-in or synthetic generator (seeded by ``workload.seed``) or the
    trace, windowed to ``[start_hour, start_hour + horizon_hours)`` and rebased so the window starts at time 0, then
    rate-scaled by ``workload.rate_scale``; when ``workload.seed`` is null, a fresh episode workload drawn from
    the run seed ``seed`` (`episode_workload`)."""
    return with_route(sc, *_unrouted_workload(sc, seed))


def _unrouted_workload(sc: Scenario, seed: int | None) -> tuple[RequestTable, int]:
    """`scenario_workload` before a route's split, and the seed of the route's draws."""
    if sc.workload.seed is None:
        if seed is None:
            raise ScenarioError(f"{sc.source}: workload.seed: null (a new workload per run seed), but no run seed was given")
        ws = derived_seed(seed, "workload")
        return with_tenant_mix(sc, episode_workload(sc, seed), ws), ws
    s = workload_seed(sc, seed)
    return with_tenant_mix(sc, _pinned_workload(sc, s, sc.workload.start_hour, "workload.start_hour"), s), s


def reference_workload(sc: Scenario, seed: int, start_hour: float | None = None) -> RequestTable:
    """The requests of the scenario's reference run (`commitments.compute_reference`): its workload pinned to
    ``seed`` and, for a trace, windowed at ``start_hour`` (``commitment.reference.start_hour``: another stretch of
    the same trace) instead of ``workload.start_hour``."""
    pinned = sc.model_copy(update={"workload": sc.workload.model_copy(update={"seed": int(seed)})})
    if start_hour is None:
        table = _pinned_workload(pinned, int(seed), sc.workload.start_hour, "workload.start_hour")
    else:
        table = _pinned_workload(pinned, int(seed), float(start_hour), "commitment.reference.start_hour")
    return with_route(sc, table, int(seed))


def _pinned_workload(sc: Scenario, s: int, start_hour: float, field: str) -> RequestTable:
    """The workload of seed ``s`` over ``[start_hour, start_hour + horizon_hours)`` (``field`` names the start
    hour in errors)."""
    r = realism_of(sc)
    wl = sc.workload
    if wl.synthetic is not None:
        h0, h1 = window_hours(start_hour, sc.horizon_hours)
        shape = minute_modulation(r, h1 - h0, derived_seed(s, "arrivals"))
        table = synthetic_window(sc, s, start_hour, sc.horizon_hours, rate_factors=[wl.rate_scale] * (h1 - h0),
                                 minute_shape=shape, field=field)
        table.meta["scenario"] = sc.name
        table.meta["workload_seed"] = s
        return table
    if wl.builtin is not None and r.level != "ideal":
        # a pinned window drawn as an episode's would be (minute modulation included), seeded by workload.seed
        H = sc.horizon_hours
        try:
            table = builtin_window(wl.builtin, s, start_hour, H, rate_factors=[wl.rate_scale] * H,
                                   minute_shape=minute_modulation(r, H, derived_seed(s, "arrivals")))
        except WorkloadError as e:
            raise ScenarioError(f"{sc.source}: workload: {e}") from None
        table.meta["scenario"] = sc.name
        table.meta["workload_seed"] = s
        return table
    src = _source_table(sc, s)
    t0 = start_hour * 3600.0
    t1 = t0 + sc.horizon_hours * 3600.0
    # the source's span in whole hours: a generator's hour count, else the trace's last arrival rounded up
    counts = src.meta.get("hourly_counts")
    span_h = len(counts) if counts else int(np.ceil(src.duration_s / 3600.0 - 1e-9))
    what = f"built-in '{wl.builtin}'" if wl.builtin is not None else f"trace '{wl.trace}'"
    if len(src) == 0 or t1 > span_h * 3600.0 + 1e-6:
        raise ScenarioError(
            f"{sc.source}: {field}: the window [{start_hour:g} h, {t1 / 3600:g} h) runs past the end "
            f"of the {what}, which spans {span_h} h; expected start_hour + horizon_hours <= {span_h}"
        )
    table = time_window(src, t0, t1, rebase=True)
    if wl.trace is not None and field == "workload.start_hour":
        _warn_if_trace_just_overruns(sc, src, t1)
    if wl.rate_scale != 1.0:
        table = scale_rate(table, wl.rate_scale, seed=s)
    table.meta["scenario"] = sc.name
    table.meta["workload_seed"] = s
    return table


def engine_options(sc: Scenario, seed: int = 0) -> EngineOptions:
    """Engine options of a run with run seed ``seed``: SLO scale, the realism level's truth model (``ideal``: the
    legacy per-segment noise), what the controller sees (oracle lengths or predictions with log-normal error and
    bias; deadlines from true or predicted lengths), and the scenario's ``engine`` prefix-caching settings (when
    given; else the engine's defaults)."""
    r = realism_of(sc)
    ideal = r.level == "ideal"
    noise = NoiseSpec(time_sigma=sc.noise.time_sigma, energy_sigma=sc.noise.energy_sigma) if ideal else NoiseSpec(0.0, 0.0)
    return EngineOptions(
        alpha=float(sc.alpha),
        noise=noise,
        seed=int(seed),
        length_error_sigma=float(sc.observation.length_error_sigma if ideal else r.lengths.sigma),
        length_bias=float(r.lengths.bias),
        oracle_lengths=sc.observation.lengths == "oracle",
        truth=truth_spec(sc),
        visible_deadlines=r.deadlines,
        **{k: v for k, v in sc.engine.overrides().items()
           if k in ("prefix_caching", "prefix_block_tokens", "dispatch", "scale_to_zero")},
        **({"migration": sc.engine.migration} if sc.engine.migration is not None else {}),
    )
