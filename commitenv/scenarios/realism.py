"""Realism levels: the named, sourced set of ways the ground truth differs from what a controller sees.

A scenario says ``realism: ideal | paper | hard`` (or a mapping with ``level`` and per-component overrides).
``ideal`` is the exact reproduction setting (truth = nominal profile up to the scenario's legacy ``noise``, true
deadlines visible); ``paper`` puts in the gaps a real pool of the ePACT paper's kind has, each magnitude with its
source in `SOURCES` and docs/realism.md; ``hard`` stresses controllers with the upper ends of the same ranges.
Zero-mean noise is cancelled by a controller's feedback; what makes tracking hard is systematic: the meter a
controller reads is not the one that is settled, and the predictor's energy model is not the hardware.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Level = Literal["ideal", "paper", "hard"]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LatencyFriction(_Part):
    """Per-request overheads outside the engine and step-time noise, tails and stragglers (truth only)."""

    overhead_s: float = Field(default=0.0, ge=0, le=60)  # mean per-request overhead (tokenize, API, network), s
    overhead_prefill_tokens: float = Field(default=0.0, ge=0, le=100_000)  # ... plus this many tokens' prefill time
    overhead_cv: float = Field(default=0.0, ge=0, le=10)
    cell_s: float = Field(default=10.0, gt=0, le=3600)  # grid of the time-varying factors
    time_sigma: float = Field(default=0.0, ge=0, lt=1)  # i.i.d. per-cell step-time noise
    energy_sigma: float = Field(default=0.0, ge=0, lt=1)
    straggler_prob: float = Field(default=0.0, ge=0, lt=1)  # share of GPU cells that run slow
    straggler_factor: float = Field(default=1.0, ge=1, le=10)


class GpuVariation(_Part):
    """Per-GPU static speed and power factors drawn per episode, and slow AR(1) thermal drift (truth only)."""

    speed_sigma: float = Field(default=0.0, ge=0, lt=1)
    power_sigma: float = Field(default=0.0, ge=0, lt=1)
    drift_time_sigma: float = Field(default=0.0, ge=0, lt=1)
    drift_energy_sigma: float = Field(default=0.0, ge=0, lt=1)
    drift_tau_s: float = Field(default=600.0, gt=0)


class EnergyModel(_Part):
    """How far the predictor's energy model is from the hardware: the truth runs the calibrated profile, a what-if
    copy runs it with every energy divided by ``1 + bias`` (the predictor reads low, as ePACT's did)."""

    bias: float = Field(default=0.0, gt=-0.5, lt=1)


class Meters(_Part):
    """The controller reads an NVML-like counter per GPU; settlement reads the pool meter."""

    gpu_bias: float = Field(default=0.0, ge=0, lt=0.5)  # per-GPU systematic error, uniform in [-gpu_bias, +gpu_bias]
    update_s: float = Field(default=0.0, ge=0, le=1)  # counter refresh period (readings lag by up to this)
    quantum_j: float = Field(default=0.0, ge=0, le=1)  # counter resolution (NVML: 1 mJ)
    pool_overhead: float = Field(default=0.0, ge=0, lt=1)  # settled energy = boards x (1 + overhead) (host, PSU)


class Lengths(_Part):
    """Output-length prediction a controller sees: log-normal error and relative bias."""

    sigma: float = Field(default=0.25, ge=0, lt=3)
    bias: float = Field(default=0.0, gt=-0.9, lt=10)


class Arrivals(_Part):
    """Minute-scale modulation of the arrival rate (log-normal, AR(1) over minutes), drawn per episode."""

    minute_sigma: float = Field(default=0.0, ge=0, le=3)
    minute_corr: float = Field(default=0.0, ge=0, lt=1)  # lag-one autocorrelation of the minute factors


class PlanningDelay(_Part):
    """When a decision applies, after the interval starts: ``measured``, the time the runner measured around
    ``act()`` (`commitenv.planning`: wall or CPU of the controller and its workers, whichever is larger; at least what
    the controller reports and at least ``seconds``), rounded to ``resolution_s``; ``reported``, what the controller
    reports (0 unless it says otherwise); ``fixed``, ``seconds`` for every change."""

    mode: Literal["measured", "reported", "fixed"] = "reported"
    seconds: float = Field(default=0.0, ge=0)
    resolution_s: float = Field(default=0.1, ge=0, le=60)


class Realism(_Part):
    """A realism level with its components (``realism: paper`` or ``realism: {level: paper, meters: {...}}``)."""

    level: Level = "paper"
    latency: LatencyFriction | None = None
    gpu_variation: GpuVariation | None = None
    energy_model: EnergyModel | None = None
    meters: Meters | None = None
    lengths: Lengths | None = None
    deadlines: Literal["true", "predicted"] | None = None
    arrivals: Arrivals | None = None
    planning_delay: PlanningDelay | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, v: Any) -> Any:
        return {"level": v} if isinstance(v, str) else v

    def resolved(self) -> "Realism":
        """Every component filled in: the level's preset, then the scenario's overrides (field by field)."""
        base = PRESETS[self.level]
        out: dict[str, Any] = {"level": self.level}
        for name in COMPONENTS:
            preset = getattr(base, name)
            over = getattr(self, name)
            if over is None:
                out[name] = preset
            elif isinstance(over, BaseModel):
                out[name] = preset.model_copy(update=over.model_dump(exclude_unset=True))
            else:
                out[name] = over
        return Realism.model_construct(**out)


COMPONENTS = ("latency", "gpu_variation", "energy_model", "meters", "lengths", "deadlines", "arrivals",
              "planning_delay")

PRESETS: dict[str, Realism] = {
    "ideal": Realism.model_construct(
        level="ideal", latency=LatencyFriction(), gpu_variation=GpuVariation(), energy_model=EnergyModel(),
        meters=Meters(), lengths=Lengths(), deadlines="true", arrivals=Arrivals(), planning_delay=PlanningDelay(),
    ),
    "paper": Realism.model_construct(
        level="paper",
        latency=LatencyFriction(overhead_prefill_tokens=530, overhead_cv=1.0, time_sigma=0.03, energy_sigma=0.02,
                                straggler_prob=0.01, straggler_factor=1.5),
        gpu_variation=GpuVariation(speed_sigma=0.05, power_sigma=0.05, drift_time_sigma=0.02,
                                   drift_energy_sigma=0.02, drift_tau_s=600.0),
        energy_model=EnergyModel(bias=0.155),
        meters=Meters(gpu_bias=0.05, update_s=0.1, quantum_j=0.001),
        lengths=Lengths(sigma=0.5, bias=0.0),
        deadlines="predicted",
        arrivals=Arrivals(minute_sigma=0.21, minute_corr=0.5),
        planning_delay=PlanningDelay(mode="measured"),
    ),
    "hard": Realism.model_construct(
        level="hard",
        latency=LatencyFriction(overhead_prefill_tokens=800, overhead_cv=1.5, time_sigma=0.05, energy_sigma=0.04,
                                straggler_prob=0.03, straggler_factor=2.0),
        gpu_variation=GpuVariation(speed_sigma=0.1, power_sigma=0.08, drift_time_sigma=0.04,
                                   drift_energy_sigma=0.04, drift_tau_s=300.0),
        energy_model=EnergyModel(bias=0.167),
        meters=Meters(gpu_bias=0.05, update_s=0.1, quantum_j=0.001, pool_overhead=0.06),
        lengths=Lengths(sigma=0.85, bias=0.1),
        deadlines="predicted",
        arrivals=Arrivals(minute_sigma=1.0, minute_corr=0.5),
        planning_delay=PlanningDelay(mode="measured", seconds=23.35),
    ),
}

# Where each magnitude of the presets comes from (docs/realism.md has the quotes and the table).
SOURCES: dict[str, str] = {
    "latency.overhead_prefill_tokens": "calibrated (as the profiles' energies were) against the ePACT paper's hardware "
                          "single hours: vLLM misses 2.70/1.51/1.00 % (H20) and 0.36/0.23/0.14 % (H200) at alpha "
                          "2.5/3/3.5 (Table 2). Fitted per GPU as absolute seconds the overheads are 0.15 s (H20) and "
                          "0.044 s (H200), in the ratio of the profiles' prefill time per token (0.281 / 0.083 ms, 3.4x), "
                          "so one figure for both: the prefill time of ~530 tokens, i.e. a prefill-side cost that the "
                          "fitted step law misses (tokenization, API server, detokenization ~1.3 % of run time per vLLM "
                          "PR #818, 5-13 ms CPU work per step per vLLM issue #6854); no public per-request figure",
    "latency.time_sigma": "StepSplit: the linear step model has a median error of 0.2-4.8 % per step; ePACT App. C.5 "
                          "held-out latency WAPE 0.44-2.66 % (4.15 % with continuous arrivals)",
    "latency.energy_sigma": "ePACT App. C.5 held-out energy WAPE 0.19-2.89 %; StepSplit: identical H100 runs differ "
                            "0.1-4.3 % in energy",
    "latency.straggler": "ML.ENERGY leaderboard v3 (shared/data/profiles): H100 p99/p50 inter-token latency median 2.70 "
                         "(IQR 1.59-4.35), prefill interference included, so an upper bound on decode jitter",
    "gpu_variation.speed_sigma": "Sinha et al., 'Not All GPUs Are Created Equal' (arXiv 2208.11035v3): 8 % (max 22 %) "
                                 "average performance variation across identical GPUs, outliers 1.5x slower",
    "gpu_variation.power_sigma": "Sinha et al. (same): power varies with performance across identical parts; no separate "
                                 "public spread for H-series boards, taken equal in size to the speed spread",
    "gpu_variation.drift": "ePACT App. C.1: H200 capped at 1710 MHz because 1980 MHz throttles thermally; no public "
                           "time constant for thermal drift (600 s is this environment's choice)",
    "energy_model.bias": "ePACT Table 2: Static-Target, which targets the commitment with the paper's own predictor, "
                         "overuses by 15.41-16.69 % on hardware (fixed commitments); the predictor's energy model reads "
                         "low by that much (paper: 1.155, hard: 1.167, the top of the range)",
    "meters.gpu_bias": "NVML documentation: power accuracy +-5 % stated for Fermi/Kepler; no accuracy stated for "
                       "Ampere/Hopper, so +-5 % per GPU is the only public figure",
    "meters.update_s": "NVML nvmlDeviceGetTotalEnergyConsumption: mJ since driver load; updated every 20-100 ms "
                       "(PETSc docs), 10 Hz measured (StepSplit)",
    "meters.pool_overhead": "hard only: 80 PLUS Titanium PSU efficiency 94-96 % at 20-50 % load (Tom's Hardware "
                            "table): settlement on the wall meter sees ~4-6 % more than the boards",
    "lengths.sigma": "no public log-normal sigma for output-length predictors; the best published predictors have MAE "
                     "68-93 tokens on LMSYS-Chat-1M (about half the mean output); 0.85 is the spread of log output "
                     "length in the Azure traces (a predictor that knows nothing)",
    "deadlines": "ePACT sec. 4.1: d_i = a_i + alpha L_ref_i needs the true output length; an operator can only state "
                 "it from the predicted one",
    "arrivals.minute_sigma": "Azure 2023 traces (shared/data/traces): Fano factor of 60-s counts 16.1 (conversation, "
                             "332 req/min) and 164 (code, 154 req/min) against ~1 + m s^2 for minute factors of sigma s: "
                             "s = 0.21 (conv, paper) and 1.0 (code, hard)",
    "planning_delay": "paper and hard: the time each decision took, measured by the runner (ePACT's search runs "
                      "asynchronously with serving, sec. 4.4, so its action applies once computed); hard charges at "
                      "least ePACT sec. 5.5's 23.35 s mean search time per decision",
}


def resolve(realism: Realism | str | None) -> Realism:
    """The full component set of a scenario's realism (a level name or a partial `Realism`)."""
    if realism is None:
        realism = "paper"
    if isinstance(realism, str):
        realism = Realism(level=realism)
    return realism.resolved()
