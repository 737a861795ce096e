"""Validated schema of a scenario file (``scenarios/*.yaml``): pool, workload, horizon, commitments,
settlement rates, SLO, what the controller may see, and truth-versus-prediction noise."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from commitenv.scenarios.realism import Realism
from commitenv.sim.migration import MigrationSpec


class ScenarioError(ValueError):
    """A scenario is unknown, unreadable or invalid; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """One model of a shared pool: its profile (name or path) and the workload tenants it serves."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    profile: str
    tenants: list[str] = Field(min_length=1)


class InstanceSpec(_Strict):
    """A model instance placed on a GPU with a share of its SMs and, optionally, the KV budget it declares
    (``kv_tokens``: its memory is then its footprint plus that budget, like a per-process
    ``gpu_memory_utilization`` in vLLM; absent: it reserves its SM share of the GPU's usable memory)."""

    model: str
    share: float = Field(default=1.0, gt=0, le=1)
    kv_tokens: int | None = Field(default=None, gt=0)


class PoolSpec(_Strict):
    """GPU pool: one model (``profile``: name or path; one replica per GPU), or several models sharing the GPUs
    (``models``, with ``placement``: for every GPU the instances it hosts and their SM shares, summing to <= 1;
    one clock per GPU)."""

    profile: str | None = None
    gpus: int = Field(ge=1, le=4096)
    models: list[ModelSpec] | None = None
    placement: list[list[InstanceSpec]] | None = None

    @model_validator(mode="after")
    def _check(self) -> "PoolSpec":
        if (self.profile is None) == (self.models is None):
            raise ValueError("pool: give exactly one of 'profile' (one model) or 'models' (a shared pool)")
        if self.models is None:
            if self.placement is not None:
                raise ValueError("pool.placement: only for a shared pool (pool.models)")
            return self
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"pool.models: model names must be distinct, got {names}")
        tenants = [t for m in self.models for t in m.tenants]
        if len(set(tenants)) != len(tenants):
            raise ValueError(f"pool.models: a tenant may be served by one model only, got {tenants}")
        if self.placement is None:
            raise ValueError("pool.placement: a shared pool needs the instances of every GPU "
                             "(a list of pool.gpus lists of {model, share})")
        if len(self.placement) != self.gpus:
            raise ValueError(f"pool.placement: expected {self.gpus} GPUs (pool.gpus), got {len(self.placement)}")
        placed = set()
        for g, insts in enumerate(self.placement):
            if not insts:
                raise ValueError(f"pool.placement[{g}]: a GPU must host at least one instance")
            for i in insts:
                if i.model not in names:
                    raise ValueError(f"pool.placement[{g}]: unknown model '{i.model}' (pool.models: {names})")
                placed.add(i.model)
            total = sum(i.share for i in insts)
            if total > 1.0 + 1e-9:
                raise ValueError(f"pool.placement[{g}]: SM shares sum to {total:g} > 1")
        missing = [n for n in names if n not in placed]
        if missing:
            raise ValueError(f"pool.placement: model(s) {missing} have no instance")
        return self

    @property
    def shared(self) -> bool:
        return self.models is not None


_PATH_HINTS = (".json", "/", "\\")


def builtin_length_tables() -> list[str]:
    """Names of the shipped length tables (``commitenv/workload/data/<name>_lengths.json``)."""
    from commitenv.workload.lengths import DATA_DIR

    return sorted(p.name[: -len("_lengths.json")] for p in DATA_DIR.glob("*_lengths.json"))


class SyntheticSpec(_Strict):
    """A synthetic source given hour by hour in the file (`commitenv.workload.synthesize`).

    Exactly one of ``hourly_counts`` (exact arrivals per hour) or ``hourly_rates`` (expected arrivals per hour,
    counts vary per draw); ``lengths``: a shipped length table (``azure_code``, ``azure_conv``) or a path to a
    lengths JSON (``EmpiricalLengths.to_json``; relative paths are looked up next to the scenario file, then in
    the current folder); ``burstiness_cv``: CV of the gamma inter-arrival gaps (1 = Poisson); ``smooth``: the
    within-hour rate interpolates between hourly levels; ``context_limit``: caps sampled prompt + output tokens
    (null: the length table's own cap, none for the shipped tables). The source spans ``len(hourly_...)`` hours
    from time 0; the scenario serves ``[workload.start_hour, workload.start_hour + horizon_hours)`` of it.
    """

    hourly_counts: list[int] | None = None
    hourly_rates: list[float] | None = None
    lengths: str = Field(min_length=1)
    burstiness_cv: float = Field(default=1.0, gt=0)
    smooth: bool = True
    context_limit: int | None = Field(default=None, ge=2)

    @model_validator(mode="after")
    def _check(self) -> "SyntheticSpec":
        if (self.hourly_counts is None) == (self.hourly_rates is None):
            raise ValueError("workload.synthetic: give exactly one of 'hourly_counts' (exact arrivals per hour) or "
                             "'hourly_rates' (expected arrivals per hour)")
        name, vals = (("hourly_counts", self.hourly_counts) if self.hourly_counts is not None
                      else ("hourly_rates", self.hourly_rates))
        if not vals:
            raise ValueError(f"workload.synthetic.{name}: expected at least one hourly value")
        bad = [(h, v) for h, v in enumerate(vals) if not 0 <= v < float("inf")]
        if bad:
            h, v = bad[0]
            raise ValueError(f"workload.synthetic.{name}: each hourly value must be a finite number >= 0; got {v} "
                             f"at index {h}")
        if not sum(vals) > 0:
            raise ValueError(f"workload.synthetic.{name}: every hour is 0; expected some arrivals")
        if not self.burstiness_cv < float("inf"):
            raise ValueError(f"workload.synthetic.burstiness_cv: expected a finite value > 0, got {self.burstiness_cv}")
        if not self.lengths_is_path:
            have = builtin_length_tables()
            if self.lengths not in have:
                raise ValueError(f"workload.synthetic.lengths: unknown length table '{self.lengths}'; expected one of "
                                 f"{', '.join(have)} or a path to a lengths JSON file")
        return self

    @property
    def hours(self) -> int:
        """Hours the source spans."""
        return len(self.hourly_counts if self.hourly_counts is not None else self.hourly_rates)

    @property
    def lengths_is_path(self) -> bool:
        return self.lengths.endswith(_PATH_HINTS) or any(c in self.lengths for c in _PATH_HINTS[1:])


class RouteShareSpec(_Strict):
    """This pool's share of a router's arrivals (a site route, `commitenv.site`): the route's workload is drawn whole
    (the same seed for every pool of the route) and each request goes to share ``i`` with probability ``split[i]`` (one
    uniform draw per request, seeded by the workload's seed and the route's ``name``); this pool serves the requests
    of share ``index``. The route's pools together serve every request exactly once."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    split: list[float] = Field(min_length=1)
    index: int = Field(ge=0)

    @model_validator(mode="after")
    def _check(self) -> "RouteShareSpec":
        if any(not (0.0 <= v <= 1.0) for v in self.split):
            raise ValueError(f"workload.route.split: expected fractions in [0, 1], got {self.split}")
        if abs(sum(self.split) - 1.0) > 1e-9:
            raise ValueError(f"workload.route.split: fractions must sum to 1, got {sum(self.split):.12g}")
        if self.index >= len(self.split):
            raise ValueError(f"workload.route.index: expected 0 .. {len(self.split) - 1} (one per split entry), "
                             f"got {self.index}")
        return self


class WorkloadSpec(_Strict):
    """Where requests come from: a built-in generator, a trace file or a synthetic spec, and the window served.

    ``start_hour``/``hours`` select a window of the source (rebased to time 0); ``seed`` pins the workload
    (a built-in or synthetic generator's seed); null draws a new one every episode from the run seed: a built-in
    or synthetic generator with every hour's count (rate) scaled by a factor uniform in ``1 +- rate_spread`` and
    the realism's minute modulation, or a window of a trace file starting at a uniform offset in
    ``[start_hour, start_hour + window_slack_h]`` hours.
    """

    builtin: str | None = None
    trace: str | None = None
    synthetic: SyntheticSpec | None = None
    seed: int | None = 0
    start_hour: float = Field(default=0.0, ge=0)
    rate_scale: float = Field(default=1.0, gt=0)
    rate_spread: float = Field(default=0.0, ge=0, lt=1)
    window_slack_h: float = Field(default=0.0, ge=0)
    tenant_mix: dict[str, float] | None = None  # tenant name -> share of the requests (drawn per request, seeded)
    route: RouteShareSpec | None = None  # serve one share of a router's split of these arrivals (site routes)

    @model_validator(mode="after")
    def _one_source(self) -> "WorkloadSpec":
        if sum(x is not None for x in (self.builtin, self.trace, self.synthetic)) != 1:
            raise ValueError("workload: give exactly one of 'builtin', 'trace' or 'synthetic'")
        if self.seed is not None and (self.rate_spread or self.window_slack_h):
            raise ValueError("workload.rate_spread / window_slack_h: only used when workload.seed is null "
                             "(a new workload every episode)")
        if self.trace is None and self.window_slack_h:
            raise ValueError("workload.window_slack_h: only for trace files; a built-in or synthetic workload draws "
                             "its window anew per seed")
        if self.tenant_mix is not None:
            if not self.tenant_mix or any(not (v > 0) for v in self.tenant_mix.values()):
                raise ValueError(f"workload.tenant_mix: expected tenant names with positive shares, got {self.tenant_mix}")
            if abs(sum(self.tenant_mix.values()) - 1.0) > 1e-6:
                raise ValueError(f"workload.tenant_mix: shares must sum to 1, got {sum(self.tenant_mix.values()):g}")
        return self


class SeedRanges(_Strict):
    """Disjoint half-open ranges [lo, hi) of run seeds for training and for testing."""

    train: tuple[int, int]
    test: tuple[int, int]

    @model_validator(mode="after")
    def _check(self) -> "SeedRanges":
        for name in ("train", "test"):
            lo, hi = getattr(self, name)
            if not 0 <= lo < hi:
                raise ValueError(f"seeds.{name}: expected [lo, hi) with 0 <= lo < hi, got [{lo}, {hi})")
        (a, b), (c, d) = self.train, self.test
        if a < d and c < b:
            raise ValueError(f"seeds: train [{a}, {b}) and test [{c}, {d}) overlap; expected disjoint ranges")
        return self


class ReferenceSpec(_Strict):
    """The run commitments are scaled from: full-capacity vLLM (all replicas, reference clock) on the
    scenario's workload with ``workload_seed`` (a built-in or synthetic workload: a different seed = the paper's
    historical day), or, for a trace workload, the window of the same trace starting at ``start_hour`` (the
    historical hour/day: another stretch of the recorded trace; a trace has no seed to redraw)."""

    workload_seed: int | None = None  # None: the evaluation workload itself
    start_hour: float | None = Field(default=None, ge=0)  # trace workloads: the reference window's start


class EngineSpec(_Strict):
    """Engine settings of this scenario, over the profile's (null: the profile's / the engine's default).

    ``context_limit``: vLLM's max model length in tokens (a prompt at or over it is rejected, outputs are cut to
    fit); it replaces the profile's ``scheduler.context_limit`` and must fit the profile's KV capacity.
    ``prefix_caching``: vLLM automatic prefix caching (acts only on workloads with prefix hash blocks).
    ``prefix_block_tokens``: tokens per prefix hash block of the workload (a multiple of the profile's
    ``scheduler.block_size``; Mooncake traces: 512).
    ``reserve_full_sequence``: admit a waiting request only when its whole sequence fits the free KV blocks (vLLM's
    ``scheduler_reserve_full_isl``; replaces the profile's ``scheduler.reserve_full_sequence``).
    ``dispatch``: the router (`commitenv.sim.dispatch`): ``least_unfinished`` (the default) or ``prefix_affinity``
    (cache-aware routing, as production routers do); a controller's own policy replaces it.
    ``migration``: the KV transfer of requests migrated between GPUs (`commitenv.sim.migration.MigrationSpec`:
    ``link_gbs``, ``setup_s``, ``j_per_gb``; absent: an HGX H100 board's NVLink).
    ``scale_to_zero``: serverless scaling (shared pools only): a model may have no active instance (the action's
    ``active`` per model starts at 0), and a request that finds none wakes one (`EngineOptions.scale_to_zero`)."""

    context_limit: int | None = Field(default=None, ge=2)
    prefix_caching: bool | None = None
    prefix_block_tokens: int | None = Field(default=None, ge=1)
    reserve_full_sequence: bool | None = None
    dispatch: Literal["least_unfinished", "prefix_affinity"] | None = None
    migration: MigrationSpec | None = None
    scale_to_zero: bool | None = None

    def overrides(self) -> dict:
        """The settings given (a reference run's cache key holds only these)."""
        return self.model_dump(exclude_none=True)


class CommitmentSpec(_Strict):
    """Hourly commitments E*_h: absolute MJ, fractions of a reference run's hourly energy, or none at all.

    ``energy_only: true`` is the energy-only settlement (no commitment): E*_h = 0 for every hour, so every hour's
    energy is billed, C_h = lambda_plus E_h (kWh); it takes none of ``mj``, ``fractions`` or ``reference``."""

    mj: list[float] | None = None
    fractions: list[float] | None = None
    reference: ReferenceSpec | None = None
    energy_only: bool = False

    @model_validator(mode="after")
    def _check(self) -> "CommitmentSpec":
        if self.energy_only:
            for name in ("mj", "fractions", "reference"):
                if getattr(self, name) is not None:
                    raise ValueError(f"commitment.{name}: not with 'energy_only: true' (no commitment: every hour's "
                                     f"energy is billed); give either energy_only or 'mj' / 'fractions'")
            return self
        if (self.mj is None) == (self.fractions is None):
            raise ValueError("commitment: give exactly one of 'mj' (absolute) or 'fractions' (of a reference run), "
                             "or 'energy_only: true' (no commitment)")
        if self.mj is not None and any(not 0 < v < float("inf") for v in self.mj):
            raise ValueError("commitment.mj: every hourly commitment must be a finite value > 0 (MJ)")
        if self.fractions is not None:
            bad = [(h, f) for h, f in enumerate(self.fractions) if not 0 < f <= 2]
            if bad:
                h, f = bad[0]
                raise ValueError(f"commitment.fractions: each fraction must be in (0, 2]; got {f} at index {h}")
            if self.reference is None:
                raise ValueError("commitment.reference: required with 'fractions'")
        if self.mj is not None and self.reference is not None:
            raise ValueError("commitment.reference: only used with 'fractions'; absolute 'mj' commitments take none")
        return self


class GateSpec(_Strict):
    """The SLO constraint of the objective, checked per arrival hour h with N_h arrivals and m_h misses.

    ``absolute`` (ePACT eq. 1): m_h <= epsilon N_h, i.e. attainment >= 100 (1 - epsilon) %. ``relative``: m_h <=
    m_h^ref + tolerance_pp / 100 x N_h, the reference run's (``objective.lower``, vLLM at full capacity) own
    attainment in that hour minus ``tolerance_pp`` percentage points: for pools where the reference itself cannot
    meet 1 - epsilon (the ePACT paper reports attainment as gaps to vLLM's). ``reason`` says why a scenario uses it."""

    kind: Literal["absolute", "relative"] = "absolute"
    tolerance_pp: float | None = Field(default=None, ge=0, le=100)
    reason: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "GateSpec":
        if self.kind == "relative" and self.tolerance_pp is None:
            raise ValueError("objective.gate.tolerance_pp: a relative gate needs the tolerance in percentage points "
                             "below the reference's attainment (e.g. 1.0)")
        if self.kind == "absolute" and self.tolerance_pp is not None:
            raise ValueError("objective.gate.tolerance_pp: only for kind 'relative'; the absolute gate's tolerance is "
                             "the scenario's epsilon")
        return self


class ObjectiveSpec(_Strict):
    """The problem a scenario poses (ePACT eq. 1): minimise the hourly settlement cost subject to the SLO ``gate``.
    The normalised score puts the ``lower`` reference's cost at 0 and the ``upper`` one's (the hindsight optimum) at
    100 (`commitenv.scoring`); ``lower`` is also the relative gate's reference."""

    gate: GateSpec = GateSpec()
    lower: str = Field(default="vllm", min_length=1)
    upper: str = Field(default="oracle", min_length=1)


class ObservationSpec(_Strict):
    """What a controller may see: oracle output lengths or predictions with a log-normal error."""

    lengths: Literal["predicted", "oracle"] = "predicted"
    length_error_sigma: float = Field(default=0.25, ge=0, lt=3)


class NoiseSpecModel(_Strict):
    """Seeded multiplicative noise between the ground truth and the clean predictor."""

    time_sigma: float = Field(default=0.03, ge=0, lt=1)
    energy_sigma: float = Field(default=0.02, ge=0, lt=1)


class InitialConfig(_Strict):
    """Configuration in force at the start (default: all replicas at the reference clock)."""

    active: int | None = Field(default=None, ge=1)
    clock_mhz: int | None = Field(default=None, gt=0)


# ``lambda_minus E*_h / (epsilon N_h)`` of the shipped reference hours: using up the whole miss tolerance costs as much
# as leaving the hour's commitment unused, so serving fewer requests never pays (every shipped scenario states it).
DEFAULT_MISS_PENALTY_KWH = 0.015


class Scenario(_Strict):
    """One registered scenario (`commitenv/<name>-v0`); every field, its default and unit: docs/scenarios.md."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    description: str = ""  # free text; its first line is what `commitenv scenarios` lists
    pool: PoolSpec
    workload: WorkloadSpec
    horizon_hours: int = Field(ge=1, le=24 * 14)  # settled hours; the episode then serves every request left
    interval_s: float = Field(default=60.0, gt=0)  # decision interval, s; divides 3600
    commitment: CommitmentSpec
    lambda_plus: float = Field(default=2.0, gt=0)  # kWh-eq per kWh over the commitment
    lambda_minus: float = Field(default=1.0, gt=0)  # kWh-eq per kWh of commitment left unused
    alpha: float = Field(default=3.0, gt=0)  # SLO scale: deadline = arrival + alpha L_ref
    epsilon: float = Field(default=0.01, ge=0, le=1)  # miss tolerance per arrival hour (the absolute gate)
    miss_penalty_kwh: float = Field(default=DEFAULT_MISS_PENALTY_KWH, ge=0)  # kWh-eq per miss (learners' reward)
    objective: ObjectiveSpec = ObjectiveSpec()
    actuation_delay_s: float = Field(default=0.0, ge=0)  # s from the interval start to the action applying
    observation: ObservationSpec = ObservationSpec()
    noise: NoiseSpecModel = NoiseSpecModel()
    realism: Realism = Realism(level="paper")
    seeds: SeedRanges | None = None
    initial: InitialConfig = InitialConfig()
    engine: EngineSpec = EngineSpec()
    paper: dict[str, str] = Field(default_factory=dict)  # where the setting comes from

    # Where the scenario was read from (set by the loader; error messages name it). Not a field.
    _source: str | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self) -> "Scenario":
        per_hour = 3600.0 / self.interval_s
        if abs(per_hour - round(per_hour)) > 1e-9:
            raise ValueError(
                f"interval_s: {self.interval_s} s does not divide an hour; expected a divisor of 3600 s (e.g. 60)"
            )
        c = self.commitment
        field, n = ("commitment.mj", c.mj) if c.mj is not None else ("commitment.fractions", c.fractions)
        if n is not None and len(n) not in (1, self.horizon_hours):  # (energy_only: no hourly values)
            raise ValueError(
                f"{field}: expected 1 value (used for every hour) or horizon_hours={self.horizon_hours} hourly "
                f"values, got {len(n)}"
            )
        syn = self.workload.synthetic
        if syn is not None and self.workload.start_hour + self.horizon_hours > syn.hours + 1e-9:
            raise ValueError(
                f"workload.start_hour: the window [{self.workload.start_hour:g} h, "
                f"{self.workload.start_hour + self.horizon_hours:g} h) runs past the end of workload.synthetic, which "
                f"gives {syn.hours} hourly values; expected start_hour + horizon_hours <= {syn.hours}"
            )
        # (reference.workload_seed with a trace workload is refused where the reference is built,
        # `commitments.reference_workload_seed`, after the loader has checked that the trace file exists)
        ref = c.reference
        if ref is not None and ref.start_hour is not None and self.workload.trace is None:
            raise ValueError(
                "commitment.reference.start_hour: only for a trace workload; a built-in or synthetic workload takes "
                "commitment.reference.workload_seed (the same hours under another seed)"
            )
        trace_seed_null = self.workload.trace is not None and self.workload.seed is None
        if c.fractions is not None and ref is not None and trace_seed_null:
            if ref.start_hour is None:
                raise ValueError(
                    "commitment.reference.start_hour: expected a value when workload.seed is null with a trace "
                    "workload (the evaluation window then moves with the run seed, so it cannot be the frozen "
                    "reference)"
                )
        elif (
            c.fractions is not None
            and ref is not None
            and ref.workload_seed is None
            and self.workload.seed is None
        ):
            raise ValueError(
                "commitment.reference.workload_seed: expected an integer when workload.seed is null (the evaluation "
                "workload then changes with the run seed, so it cannot be the frozen reference)"
            )
        if self.pool.shared:
            mix = self.workload.tenant_mix
            if mix is None:
                raise ValueError("workload.tenant_mix: a shared pool (pool.models) needs the workload's tenants and "
                                 "their shares, each served by one model")
            served = {t for m in self.pool.models for t in m.tenants}
            unserved = sorted(set(mix) - served)
            if unserved:
                raise ValueError(f"workload.tenant_mix: tenant(s) {unserved} are served by no model (pool.models.tenants)")
            if self.initial.active is not None:
                raise ValueError("initial.active: a shared pool starts with every instance active")
        elif self.engine.scale_to_zero:
            raise ValueError("engine.scale_to_zero: only for a shared pool (pool.models), where a model's last instance "
                             "can stand by while the others serve")
        truth_parts = {"latency", "gpu_variation", "energy_model"} & self.realism.model_fields_set
        if self.realism.level == "ideal" and truth_parts and (self.noise.time_sigma or self.noise.energy_sigma):
            raise ValueError(
                f"realism.{sorted(truth_parts)[0]}: at 'ideal' a truth component replaces the legacy per-segment noise; "
                "set noise: {time_sigma: 0, energy_sigma: 0} (or drop the component)")
        if self.realism.level != "ideal":
            if "noise" in self.model_fields_set:
                raise ValueError(f"noise: the legacy per-segment noise is for realism 'ideal' only; at "
                                 f"'{self.realism.level}' set realism.latency.time_sigma / energy_sigma")
            if "length_error_sigma" in self.observation.model_fields_set:
                raise ValueError(f"observation.length_error_sigma: for realism 'ideal' only; at "
                                 f"'{self.realism.level}' set realism.lengths.sigma")
        if self.actuation_delay_s >= self.interval_s:
            raise ValueError("actuation_delay_s: must be shorter than interval_s")
        if self.initial.active is not None and self.initial.active > self.pool.gpus:
            raise ValueError(
                f"initial.active: expected at most pool.gpus={self.pool.gpus} active replicas, got {self.initial.active}"
            )
        return self

    @property
    def source(self) -> str:
        """The file this scenario was read from, or ``<scenario NAME>`` when built in memory."""
        return self._source or f"<scenario {self.name}>"

    @property
    def intervals_per_hour(self) -> int:
        return int(round(3600.0 / self.interval_s))

    @property
    def env_id(self) -> str:
        return f"commitenv/{self.name}-v0"
