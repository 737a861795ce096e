"""Validated schema of a GPU x model profile: per-clock step-time and step-energy laws, powers, limits.

Step time   t = tau0 + tau1*P + tau2*n + tau3*L + tau4*A     (seconds)
Step energy E = a + c1*P + c2*A + b*n + kappa*L              (joules, whole GPU during the step)
P: prefill tokens in the step, n: decoding requests, L: summed decode context (tokens attended),
A: prefill attention term, the number of (query, key) token pairs of the step's prefill chunks
(a chunk of c tokens after h cached tokens contributes c*h + c*(c+1)/2).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimeLaw(_Strict):
    """Coefficients of the step-duration law at one clock level (seconds and seconds per unit)."""

    tau0: float = Field(ge=0)
    tau1: float = Field(ge=0)
    tau2: float = Field(ge=0)
    tau3: float = Field(ge=0)
    tau4: float = Field(ge=0)


class EnergyLaw(_Strict):
    """Coefficients of the step-energy law at one clock level (joules and joules per unit)."""

    a: float = Field(ge=0)
    c1: float = Field(ge=0)
    c2: float = Field(ge=0)
    b: float = Field(ge=0)
    kappa: float = Field(ge=0)


class ClockLevel(_Strict):
    """One supported GPU clock: its laws and the idle power of a replica held at this clock."""

    mhz: int = Field(gt=0)
    time: TimeLaw
    energy: EnergyLaw
    active_idle_w: float = Field(gt=0)
    draining_idle_w: float = Field(gt=0)


class SchedulerLimits(_Strict):
    """vLLM scheduler and KV-cache limits of one replica."""

    token_budget: int = Field(gt=0)
    max_seqs: int = Field(gt=0)
    context_limit: int = Field(gt=1)
    block_size: int = Field(gt=0)
    kv_capacity_tokens: int = Field(gt=0)
    # vLLM's scheduler_reserve_full_isl (vLLM PR #37307, 2026): admit a waiting request only when its whole
    # sequence so far fits the free KV blocks; off (the default, and vLLM V1 before it) a first prefill chunk that
    # fits is admitted even when the rest cannot be, which can preempt the same request again and again
    reserve_full_sequence: bool = False


class Latencies(_Strict):
    """Actuation latencies: a clock change, reactivation of a standby replica (weights resident), and optionally
    a cold start (weights loaded from host memory, engine initialised) with the GPU's power meanwhile.

    ``load_s``/``load_w`` default to None ("not profiled"); given, both are required. Unset, they are left out of
    the serialised profile, so profiles without them dump (and hash) as before the fields existed.
    """

    clock_change_s: float = Field(ge=0)
    activation_s: float = Field(ge=0)
    load_s: float | None = Field(default=None, gt=0)
    load_w: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _both_or_neither(self) -> "Latencies":
        if (self.load_s is None) != (self.load_w is None):
            raise ValueError("load_s and load_w: give both (cold-start time and power) or neither")
        return self

    @model_serializer(mode="wrap")
    def _drop_unprofiled(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        for k in ("load_s", "load_w"):
            if out.get(k) is None:
                out.pop(k, None)
        return out

    @property
    def load_energy_j(self) -> float | None:
        """Energy of one cold start (J), or None when not profiled."""
        return None if self.load_s is None or self.load_w is None else self.load_s * self.load_w


class SMShareScaling(_Strict):
    """How a model instance's step time scales when it holds a fraction s of the GPU's SMs.

    Compute-bound terms (tau1, tau4: prefill) scale by s**-compute_exponent; memory-bound terms
    (tau0, tau2, tau3: weight and KV reads) by s**-memory_exponent. Dynamic (above-idle) step
    energy is the same work and is kept; the GPU's idle floor is metered once per GPU.
    """

    compute_exponent: float = Field(ge=0, le=2)
    memory_exponent: float = Field(ge=0, le=2)
    min_share: float = Field(gt=0, le=1)


class HardwareInfo(_Strict):
    name: str
    memory_gb: float = Field(gt=0)
    tdp_w: float = Field(gt=0)
    memory_bandwidth_gbs: float = Field(gt=0)


class ModelInfo(_Strict):
    name: str
    params_b: float = Field(gt=0)
    weight_gb: float = Field(gt=0)
    kv_bytes_per_token: float = Field(gt=0)


class Profile(_Strict):
    """A GPU x model profile; every numeric field must be covered by an entry of ``sources``."""

    name: str
    gpu: HardwareInfo
    model: ModelInfo
    clocks: tuple[ClockLevel, ...] = Field(min_length=1)  # a tuple: a profile shared with a controller stays read-only
    reference_clock_mhz: int
    standby_w: float = Field(gt=0)
    scheduler: SchedulerLimits
    latencies: Latencies
    sm_share: SMShareScaling
    sources: dict[str, str]
    notes: str = ""

    @model_validator(mode="after")
    def _check(self) -> "Profile":
        mhz = [c.mhz for c in self.clocks]
        if mhz != sorted(set(mhz)):
            raise ValueError(f"clocks: levels must be strictly ascending, got {mhz}")
        if self.reference_clock_mhz not in mhz:
            raise ValueError(f"reference_clock_mhz: {self.reference_clock_mhz} is not one of the clock levels {mhz}")
        sch = self.scheduler
        usable = (sch.kv_capacity_tokens // sch.block_size) * sch.block_size
        if usable < sch.context_limit:
            raise ValueError(
                f"scheduler.kv_capacity_tokens: {sch.kv_capacity_tokens} tokens ({usable} in whole blocks of "
                f"{sch.block_size}) cannot hold one request at the context limit ({sch.context_limit}); vLLM "
                "refuses such a configuration"
            )
        missing = [p for p in _numeric_paths(self.model_dump(exclude={"sources", "notes"})) if not _covered(p, self.sources)]
        if missing:
            raise ValueError(f"sources: no source or derivation given for {', '.join(missing[:8])}")
        return self

    # --- helpers used by the engine -------------------------------------------------------------
    @property
    def clock_mhz(self) -> list[int]:
        return [c.mhz for c in self.clocks]

    def clock_index(self, mhz: int) -> int:
        """Index of clock level ``mhz``; raises with the supported list when it is not supported."""
        try:
            return self.clock_mhz.index(int(mhz))
        except ValueError:
            raise ValueError(f"profile {self.name}: clock {mhz} MHz not supported; levels are {self.clock_mhz}") from None

    @property
    def reference_clock_index(self) -> int:
        return self.clock_index(self.reference_clock_mhz)

    @property
    def kv_capacity_blocks(self) -> int:
        return self.scheduler.kv_capacity_tokens // self.scheduler.block_size


def _numeric_paths(obj: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _numeric_paths(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            out += _numeric_paths(v, prefix)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        if isinstance(obj, float) and not math.isfinite(obj):
            out.append(prefix + " (not finite)")
        out.append(prefix)
    return out


def _covered(path: str, sources: dict[str, str]) -> bool:
    parts = path.split(".")
    return any(".".join(parts[:i]) in sources and sources[".".join(parts[:i])].strip() for i in range(1, len(parts) + 1))
