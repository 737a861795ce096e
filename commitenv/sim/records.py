"""The engine's records: pool layout, engine options, the step log (entries, column batches, the fields a segment
in flight carries) and the metered part of a segment in flight.

Plain data shared by the pool (`commitenv.sim.pool`), the compiled loop (`commitenv.sim.kernel`) and their readers
(attribution, backends), so none of them imports another to name a record.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from itertools import chain
from typing import NamedTuple

import numpy as np

from commitenv.sim.migration import MigrationSpec
from commitenv.sim.noise import NoiseSpec
from commitenv.sim.truth import TruthSpec


class SegmentLog(NamedTuple):
    """The step log fields of a segment in flight (`Replica.seg_log`), fixed when it starts: its members' request
    slots, new tokens, tokens computed before it and decode flags, the clock it runs at and the replica's SM share."""

    slots: tuple[int, ...]
    new_tokens: tuple[int, ...]
    computed_before: tuple[int, ...]
    decode: tuple[bool, ...]
    clock_mhz: int
    share: float

    def advanced(self, m: int) -> "SegmentLog":
        """The fields of a decode run's remainder once ``m`` of its steps were booked (each member computed m more)."""
        return self._replace(computed_before=tuple(c + m for c in self.computed_before))


@dataclass(frozen=True)
class Instance:
    """A model instance placed on a GPU with a share of its SMs and, optionally, the KV budget it declares (its
    memory is then its footprint plus that budget, else its SM share of the GPU's usable memory:
    `commitenv.sim.memory.instance_memory`)."""

    model: int = 0
    share: float = 1.0
    kv_tokens: int | None = None


@dataclass(frozen=True)
class PoolLayout:
    """Placement: for every GPU, the model instances it hosts (one per GPU unless models are co-located)."""

    gpus: tuple[tuple[Instance, ...], ...]

    @staticmethod
    def single(n_gpus: int, model: int = 0) -> "PoolLayout":
        if n_gpus < 1:
            raise ValueError(f"pool size: expected at least one GPU, got {n_gpus}")
        return PoolLayout(tuple((Instance(model, 1.0),) for _ in range(n_gpus)))

    def __post_init__(self) -> None:
        for g, insts in enumerate(self.gpus):
            if not insts:
                raise ValueError(f"layout.gpus[{g}]: a GPU must host at least one instance")
            total = sum(i.share for i in insts)
            if total > 1.0 + 1e-9:
                raise ValueError(f"layout.gpus[{g}]: SM shares sum to {total:.3f} > 1")


@dataclass
class StepLogEntry:
    """One executed segment: ``n_steps`` consecutive steps of the same requests (n_steps > 1 only for a
    decode run, in which every request adds one token per step and its context grows by one per step)."""

    gpu: int
    replica: int
    t0: float
    t1: float
    n_steps: int
    energy_j: float
    slots: tuple[int, ...]
    new_tokens: tuple[int, ...]
    computed_before: tuple[int, ...]
    decode: tuple[bool, ...] = ()  # per member: a decode token (n, L terms) rather than a prefill chunk
    clock_mhz: int = 0  # clock the segment ran at
    share: float = 1.0  # SM share of the replica
    floor_j: float = 0.0  # the GPU's idle floor over [t0, t1] that energy_j includes (the meter counts it once per GPU)

    @classmethod
    def of_segment(cls, gpu: int, replica: int, t0: float, t1: float, n_steps: int, energy_j: float, seg: SegmentLog,
                   floor_j: float) -> "StepLogEntry":
        """The entry booking (part of) a segment whose step log fields are ``seg``."""
        return cls(gpu, replica, t0, t1, n_steps, energy_j, seg.slots, seg.new_tokens, seg.computed_before, seg.decode,
                   seg.clock_mhz, seg.share, floor_j)


@dataclass(frozen=True)
class StepLogBatch:
    """Step log entries as columns (what the compiled kernel books): one row per entry, its members in CSR form
    (``count`` members per entry, in entry order). A hook with a ``take_batch`` method receives these instead of one
    `StepLogEntry` at a time (`Pool.on_step`)."""

    gpu: np.ndarray  # int64 per entry
    replica: np.ndarray  # int64
    t0: np.ndarray  # float64
    t1: np.ndarray
    n_steps: np.ndarray  # int64
    energy_j: np.ndarray  # float64
    clock_mhz: np.ndarray  # int64
    share: np.ndarray  # float64
    floor_j: np.ndarray  # float64
    count: np.ndarray  # int64 members per entry
    slots: np.ndarray  # int64 per member
    new_tokens: np.ndarray  # int64
    computed_before: np.ndarray  # int64
    decode: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.replica)

    @classmethod
    def of(cls, entries: list[StepLogEntry]) -> "StepLogBatch":
        """The columns of ``entries`` (each must carry its per-member decode flags)."""
        for e in entries:
            if len(e.decode) != len(e.slots):
                raise ValueError("step-log entries without per-member decode flags")
        head = np.array([(e.gpu, e.replica, e.t0, e.t1, e.n_steps, e.energy_j, e.clock_mhz, e.share, e.floor_j)
                         for e in entries], dtype=np.float64).reshape(len(entries), 9)

        def col(name: str, dtype) -> np.ndarray:
            return np.fromiter(chain.from_iterable(getattr(e, name) for e in entries), dtype)

        i64 = np.int64
        return cls(head[:, 0].astype(i64), head[:, 1].astype(i64), head[:, 2], head[:, 3], head[:, 4].astype(i64),
                   head[:, 5], head[:, 6].astype(i64), head[:, 7], head[:, 8],
                   np.fromiter((len(e.slots) for e in entries), i64, len(entries)), col("slots", i64),
                   col("new_tokens", i64), col("computed_before", i64), col("decode", np.bool_))

    @classmethod
    def join(cls, parts: list) -> "StepLogBatch":
        """One batch of ``parts`` in order: batches and runs of `StepLogEntry`s mixed."""
        batches, run = [], []
        for p in parts:
            if isinstance(p, StepLogBatch):
                if run:
                    batches.append(cls.of(run))
                    run = []
                batches.append(p)
            else:
                run.append(p)
        if run or not batches:
            batches.append(cls.of(run))
        if len(batches) == 1:
            return batches[0]
        names = [f.name for f in fields(cls)]
        return cls(*(np.concatenate([getattr(b, n) for b in batches]) for n in names))

    def entries(self) -> list[StepLogEntry]:
        """The same entries as `StepLogEntry` objects (Python scalars and tuples)."""
        slots, new = self.slots.tolist(), self.new_tokens.tolist()
        comp, dec = self.computed_before.tolist(), self.decode.tolist()
        out, a = [], 0
        for g, x, t0, t1, steps, e, mhz, share, floor_j, nb in zip(
                self.gpu.tolist(), self.replica.tolist(), self.t0.tolist(), self.t1.tolist(), self.n_steps.tolist(),
                self.energy_j.tolist(), self.clock_mhz.tolist(), self.share.tolist(), self.floor_j.tolist(),
                self.count.tolist()):
            b = a + nb
            out.append(StepLogEntry(g, x, t0, t1, steps, e, tuple(slots[a:b]), tuple(new[a:b]), tuple(comp[a:b]),
                                    tuple(dec[a:b]), mhz, share, floor_j))
            a = b
        return out


@dataclass(frozen=True)
class InFlightPart:
    """The part of a logged segment in flight that ran before a time ``t`` (`Pool.in_flight`): what the meter has
    counted of it by ``t``, and the segment's step log fields (`Replica.seg_log`)."""

    replica: int
    gpu: int
    t0: float
    n_steps: int
    energy_j: float  # `Replica.energy_until(t)`
    floor_j: float  # `Replica.floor_part(min(t, t1))`
    entry: SegmentLog


@dataclass
class EngineOptions:
    """Engine knobs that are not the pool's hardware: SLO scale, noise, seeding and logging."""

    alpha: float = 3.0
    noise: NoiseSpec = field(default_factory=NoiseSpec)
    seed: int = 0
    closed_form: bool = True
    log_steps: bool = False
    length_error_sigma: float = 0.25  # log-normal error of the output-length prediction a controller sees
    oracle_lengths: bool = False
    prefix_caching: bool = True  # vLLM automatic prefix caching; acts only on workloads with prefix hash blocks
    prefix_block_tokens: int = 512  # tokens per hash block of the workload (Mooncake traces: 512)
    dispatch: str = "default"  # router: "default" (least unfinished, the fast path) or a commitenv.sim.dispatch name
    truth: TruthSpec | None = None  # realism: per-GPU factors, drift, grid noise, overheads (replaces `noise`)
    length_bias: float = 0.0  # relative bias of the output-length prediction (0.1: predicts 10 % long on average)
    visible_deadlines: str = "true"  # deadline a controller sees: "true" (a + alpha L_ref) or "predicted" lengths
    migration: MigrationSpec = field(default_factory=MigrationSpec)  # KV transfer of migrated requests
    # serverless scale to zero: a model may have no active replica, and a request that finds none wakes one
    scale_to_zero: bool = False

    def __post_init__(self) -> None:
        if self.visible_deadlines not in ("true", "predicted"):
            raise ValueError(f"visible_deadlines: expected 'true' or 'predicted', got {self.visible_deadlines!r}")
        if not -0.9 < self.length_bias < 10:
            raise ValueError(f"length_bias: expected a value in (-0.9, 10), got {self.length_bias}")
        if self.truth is not None and not self.noise.off:
            raise ValueError("engine options: give either the legacy per-segment `noise` or `truth`, not both")
