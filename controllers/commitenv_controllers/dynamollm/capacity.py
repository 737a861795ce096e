"""DynamoLLM's request classes and profiled capacity: the nine (input, output) length classes, the clock laws of
a profile, and the requests/s one replica sustains per class and clock within the SLO."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

IN_EDGES = (256, 1024)  # input-length bins: short < 256 <= medium < 1024 <= long
OUT_EDGES = (100, 350)  # output-length bins (predicted): short < 100 <= medium < 350 <= long
CLASS_NAMES = tuple(f"{i}{o}" for i in "SML" for o in "SML")  # input letter, output letter
REP_PROMPT = (128, 640, 2048)  # class-representative input lengths (S, M, L)
REP_OUTPUT = (50, 225, 700)  # class-representative output lengths (S, M, L)


def classify(prompt_tokens: Any, output_tokens: Any) -> np.ndarray:
    """Class index 3 * input_bin + output_bin (0..8) of each (prompt, predicted output) pair."""
    ib = np.digitize(np.asarray(prompt_tokens), IN_EDGES)
    ob = np.digitize(np.asarray(output_tokens), OUT_EDGES)
    return (3 * ib + ob).astype(np.int64)


# ============================================================================================= profile
@dataclass(frozen=True)
class ClockLaws:
    """Step-law coefficients of every clock level as arrays over levels (at one SM share, full by default)."""

    mhz: tuple[int, ...]
    tau0: np.ndarray
    tau1: np.ndarray
    tau2: np.ndarray
    tau3: np.ndarray
    tau4: np.ndarray
    a: np.ndarray
    c1: np.ndarray
    c2: np.ndarray
    b: np.ndarray
    kappa: np.ndarray
    idle_w: np.ndarray
    standby_w: float
    budget: int
    max_seqs: int
    kv_tokens: int
    activation_s: float
    top: int  # index of the reference (top) clock

    @staticmethod
    def of(profile: Any, share: float = 1.0) -> "ClockLaws":
        """The laws of ``profile`` for an instance holding ``share`` of its GPU's SMs, placed at that share (its KV
        cache is what that memory share leaves, `commitenv.sim.memory`; the profile's capacity at share 1)."""
        from commitenv.sim.coeffs import coeffs_for
        from commitenv.sim.memory import kv_blocks

        cs = [coeffs_for(profile, i, share) for i in range(len(profile.clocks))]

        def arr(name: str) -> np.ndarray:
            return np.array([getattr(c, name) for c in cs], dtype=np.float64)

        sch = profile.scheduler
        return ClockLaws(
            mhz=tuple(profile.clock_mhz),
            tau0=arr("tau0"), tau1=arr("tau1"), tau2=arr("tau2"), tau3=arr("tau3"), tau4=arr("tau4"),
            a=arr("a"), c1=arr("c1"), c2=arr("c2"), b=arr("b"), kappa=arr("kappa"), idle_w=arr("idle_w"),
            standby_w=float(profile.standby_w),
            budget=int(sch.token_budget),
            max_seqs=int(sch.max_seqs),
            kv_tokens=kv_blocks(profile, share, f"{profile.name} at share {share}") * sch.block_size,
            activation_s=float(profile.latencies.activation_s),
            top=profile.reference_clock_index,
        )

    @property
    def n_clocks(self) -> int:
        return len(self.mhz)


@dataclass(frozen=True)
class ClassCapacity:
    """Per class (rows, `CLASS_NAMES` order) and clock level (columns)."""

    rate: np.ndarray  # requests/s one replica sustains within slo_frac of the SLO (0: clock too slow)
    busy_s: np.ndarray  # replica-seconds per request at that concurrency (= 1 / rate)
    energy_j: np.ndarray  # step energy per request (idle floor during its steps included)
    dyn_j: np.ndarray  # energy per request above the active-idle floor
    batch: np.ndarray  # concurrency B* the capacity was taken at
    lref_s: np.ndarray  # reference latency of the class representative (top clock, alone)


def class_capacity(laws: ClockLaws, alpha: float, slo_frac: float = 0.5,
                   rep_prompt: tuple[int, ...] = REP_PROMPT, rep_output: tuple[int, ...] = REP_OUTPUT) -> ClassCapacity:
    """Profiled capacity of one replica per class and clock (see the module docstring for the model)."""
    F = laws.n_clocks
    rate = np.zeros((9, F))
    busy = np.full((9, F), np.inf)
    energy = np.full((9, F), np.inf)
    dyn = np.full((9, F), np.inf)
    batch = np.zeros((9, F), dtype=np.int64)
    lref = np.zeros(9)
    for c in range(9):
        p = float(rep_prompt[c // 3])
        o = float(rep_output[c % 3])
        d = o - 1.0
        k = math.ceil(p / laws.budget) + d  # steps per request
        A = p * (p + 1) / 2
        ctx = d * p + d * (d + 1) / 2  # summed context over the decode steps
        w = laws.tau1 * p + laws.tau4 * A + laws.tau2 * d + laws.tau3 * ctx  # marginal time per request (F,)
        e = laws.c1 * p + laws.c2 * A + laws.b * d + laws.kappa * ctx  # marginal energy per request (F,)
        lat1 = w + k * laws.tau0  # standalone latency at each clock
        lref[c] = lat1[laws.top]
        target = slo_frac * alpha * lref[c]
        bmax = max(1, min(laws.max_seqs, int(laws.kv_tokens // (p + o))))
        for f in range(F):
            bstar = math.floor((target - k * laws.tau0[f]) / w[f] + 1e-12) if w[f] > 0 else bmax
            bstar = min(bstar, bmax)
            if bstar < 1:
                continue
            t_busy = w[f] + k * laws.tau0[f] / bstar
            rate[c, f] = 1.0 / t_busy
            busy[c, f] = t_busy
            energy[c, f] = e[f] + k * laws.a[f] / bstar
            dyn[c, f] = energy[c, f] - laws.idle_w[f] * t_busy
            batch[c, f] = bstar
    return ClassCapacity(rate, busy, energy, dyn, batch, lref)
