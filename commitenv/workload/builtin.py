"""Built-in workloads that need no trace files: everything they use ships inside this package.

``azure-code-day`` stands in for the ePACT paper's evaluation day, Saturday 2024-05-11 of the Azure LLM
inference coding trace (2024 week-long release, 969,781 requests), which is not redistributed here.

Derivation of :data:`AZURE_CODE_DAY_HOURLY_COUNTS` (reproducible; the numbers are hard-coded so that the
package needs nothing outside it). The paper's Table 4 gives, per trace hour, the full-capacity vLLM energy
``E_h`` of its 32-GPU H20 pool (the paper's appendix table of hourly references, ``h20_reference_vllm_mj``).
Energy above the pool's idle floor ``F`` is roughly proportional to arrivals, so::

    counts_h ∝ E_h - F,   F = 14.0 MJ  (32 GPUs x ~121.5 W x 3600 s)

scaled to 969,781 and rounded by largest remainder (ties to the earlier hour) so they sum exactly. This puts
the trough at hour 10 (10,692 requests, ~178/min) and the peak at hour 19 (59,289, ~988/min), in line with
the dataset's per-minute plot for May 11 (trough ~150-300/min near 10:00 UTC, peak ~1,000-1,400/min near
19:00-20:00 UTC).

Burstiness: ``burstiness_cv = 2.0``. The per-minute plot shows minute-to-minute swings of roughly +-10-15 % at
~1,000 requests/min, several times Poisson noise (+-3 %). A gamma renewal process with CV ``c`` has per-minute
count variance ~``c**2`` times the mean, so ``c = 2`` gives swings of ~+-13 % (two standard deviations). For
comparison the 2023 coding file is far burstier (inter-arrival CV ~13, batch-like) and the 2023 conversation
file is near Poisson (CV ~1.05 within 5-minute windows), which ``azure-conv-hour`` uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .lengths import builtin_lengths
from .synthetic import synthesize, synthesize_window
from .table import RequestTable, WorkloadError

CONTEXT_LIMIT = 16_384  # vLLM context limit in the ePACT setup
AZURE_CODE_DAY_TOTAL = 969_781
AZURE_CODE_DAY_HOURLY_COUNTS: tuple[int, ...] = (
    57115, 52140, 48415, 47615, 42295, 34222, 29525, 20801, 15471, 12584, 10692, 16381,
    26207, 37009, 45221, 47567, 49717, 53979, 57776, 59289, 54410, 51714, 52801, 46835,
)
AZURE_CODE_DAY_CV = 2.0
AZURE_CONV_HOUR_COUNT = 19_366  # requests in the 58-minute 2023 conversation file, taken as one hour
AZURE_CONV_HOUR_CV = 1.05


def azure_code_day(seed: int = 0) -> RequestTable:
    """The default day: 969,781 requests over 24 h with the hourly counts above, coding lengths capped to
    16,384 tokens of context. Seeds change arrival times and lengths, never the hourly counts (the paper's
    'historical' preceding Saturday is the same day under another seed)."""
    lengths = builtin_lengths("azure_code").with_context_limit(CONTEXT_LIMIT)
    table = synthesize(AZURE_CODE_DAY_HOURLY_COUNTS, lengths=lengths, seed=seed, burstiness_cv=AZURE_CODE_DAY_CV,
                       smooth=True)
    table.meta["builtin"] = "azure-code-day"
    return table


def azure_conv_hour(seed: int = 0) -> RequestTable:
    """One hour of 19,366 requests (the 2023 conversation file's volume) with conversation lengths, near-Poisson
    arrivals (CV 1.05), capped to 16,384 tokens of context."""
    lengths = builtin_lengths("azure_conv").with_context_limit(CONTEXT_LIMIT)
    table = synthesize([AZURE_CONV_HOUR_COUNT], lengths=lengths, seed=seed, burstiness_cv=AZURE_CONV_HOUR_CV)
    table.meta["builtin"] = "azure-conv-hour"
    return table


_REGISTRY: dict[str, Callable[[int], RequestTable]] = {
    "azure-code-day": azure_code_day,
    "azure-conv-hour": azure_conv_hour,
}


@dataclass(frozen=True)
class BuiltinShape:
    """What a built-in generator is made of, so that a window of it can be drawn without the whole source."""

    hourly_counts: tuple[int, ...]
    lengths: str
    burstiness_cv: float
    smooth: bool


SHAPES: dict[str, BuiltinShape] = {
    "azure-code-day": BuiltinShape(AZURE_CODE_DAY_HOURLY_COUNTS, "azure_code", AZURE_CODE_DAY_CV, True),
    "azure-conv-hour": BuiltinShape((AZURE_CONV_HOUR_COUNT,), "azure_conv", AZURE_CONV_HOUR_CV, False),
}


def builtin_window(name: str, seed: int, start_hour: float, hours: int, *, rate_factors: Sequence[float] | None = None,
                   minute_shape: Sequence[float] | None = None) -> RequestTable:
    """Hours ``[start_hour, start_hour + hours)`` of a built-in generator's shape, drawn afresh from ``seed``
    (not a window of the whole day under that seed: only the hours needed are generated, plus one on either side
    so that a smooth within-hour shape is the day's: their levels shape the edges, no arrivals are drawn for them).
    ``rate_factors`` scales every hour's count (one factor per hour of the window, neighbours take their window
    edge's), ``minute_shape`` (60 weights per hour of the window) modulates arrivals within each hour. Rebased so
    the window starts at time 0."""
    try:
        shape = SHAPES[name]
    except KeyError:
        raise WorkloadError(f"unknown built-in workload {name!r} (have: {', '.join(list_builtin())})") from None
    lengths = builtin_lengths(shape.lengths).with_context_limit(CONTEXT_LIMIT)
    try:
        out = synthesize_window(shape.hourly_counts, counts=True, start_hour=start_hour, hours=hours, lengths=lengths,
                                seed=seed, burstiness_cv=shape.burstiness_cv, smooth=shape.smooth,
                                rate_factors=rate_factors, minute_shape=minute_shape)
    except WorkloadError as e:
        raise WorkloadError(f"built-in {name!r}: {e}") from None
    out.meta["builtin"] = name
    return out


def list_builtin() -> list[str]:
    """Names accepted by :func:`builtin_workload`."""
    return sorted(_REGISTRY)


def builtin_workload(name: str, seed: int = 0) -> RequestTable:
    """A built-in workload by name (see :func:`list_builtin`)."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise WorkloadError(f"unknown built-in workload {name!r} (have: {', '.join(list_builtin())})") from None
    return factory(seed)
