"""Validated schema of a scenario file (``scenarios/*.yaml``): pool, workload, horizon, commitments,
settlement rates, SLO, what the controller may see, and truth-versus-prediction noise."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from commitenv.scenarios.realism import Realism


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolSpec(_Strict):
    """GPU pool: profile name (or path) and GPU count, one replica per GPU."""

    profile: str
    gpus: int = Field(ge=1, le=4096)


class WorkloadSpec(_Strict):
    """Where requests come from: a built-in generator or a trace file, and the window served.

    ``start_hour``/``hours`` select a window of the source (rebased to time 0); ``seed`` pins the workload
    (a built-in generator's seed); null draws a new one every episode from the run seed: a built-in generator
    with every hour's count scaled by a factor uniform in ``1 +- rate_spread``, or a window of a trace file
    starting at a uniform offset in ``[start_hour, start_hour + window_slack_h]`` hours.
    """

    builtin: str | None = None
    trace: str | None = None
    seed: int | None = 0
    start_hour: float = Field(default=0.0, ge=0)
    rate_scale: float = Field(default=1.0, gt=0)
    rate_spread: float = Field(default=0.0, ge=0, lt=1)
    window_slack_h: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _one_source(self) -> "WorkloadSpec":
        if (self.builtin is None) == (self.trace is None):
            raise ValueError("workload: give exactly one of 'builtin' or 'trace'")
        if self.seed is not None and (self.rate_spread or self.window_slack_h):
            raise ValueError("workload.rate_spread / window_slack_h: only used when workload.seed is null "
                             "(a new workload every episode)")
        if self.builtin is not None and self.window_slack_h:
            raise ValueError("workload.window_slack_h: only for trace files; a built-in draws its window anew per seed")
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
    scenario's workload with ``workload_seed`` (a different seed = the paper's historical day)."""

    workload_seed: int | None = None  # None: the evaluation workload itself


class CommitmentSpec(_Strict):
    """Hourly commitments E*_h: absolute MJ, or fractions of a reference run's hourly energy."""

    mj: list[float] | None = None
    fractions: list[float] | None = None
    reference: ReferenceSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> "CommitmentSpec":
        if (self.mj is None) == (self.fractions is None):
            raise ValueError("commitment: give exactly one of 'mj' (absolute) or 'fractions' (of a reference run)")
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


class Scenario(_Strict):
    """One registered scenario (`commitenv/<name>-v0`)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    description: str = Field(min_length=1)
    pool: PoolSpec
    workload: WorkloadSpec
    horizon_hours: int = Field(ge=1, le=24 * 14)
    interval_s: float = Field(default=60.0, gt=0)
    commitment: CommitmentSpec
    lambda_plus: float = Field(default=2.0, gt=0)
    lambda_minus: float = Field(default=1.0, gt=0)
    alpha: float = Field(default=3.0, gt=0)
    epsilon: float = Field(default=0.01, ge=0, le=1)
    miss_penalty_kwh: float = Field(default=0.0, ge=0)
    actuation_delay_s: float = Field(default=0.0, ge=0)
    observation: ObservationSpec = ObservationSpec()
    noise: NoiseSpecModel = NoiseSpecModel()
    realism: Realism = Realism(level="paper")
    seeds: SeedRanges | None = None
    initial: InitialConfig = InitialConfig()
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
        if len(n) not in (1, self.horizon_hours):
            raise ValueError(
                f"{field}: expected 1 value (used for every hour) or horizon_hours={self.horizon_hours} hourly "
                f"values, got {len(n)}"
            )
        if (
            c.fractions is not None
            and c.reference is not None
            and c.reference.workload_seed is None
            and self.workload.seed is None
        ):
            raise ValueError(
                "commitment.reference.workload_seed: expected an integer when workload.seed is null (the evaluation "
                "workload then changes with the run seed, so it cannot be the frozen reference)"
            )
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
