"""Festina's per-GPU local scheduler (paper sec. 3.4, "Joint Frequency-SM Adaptation") as a commitenv local
scheduling policy (`commitenv.sim.local`): a unified urgency score over prefills and decodes, batch filling in
descending score with bypass, and a frequency sweep choosing the lowest-energy clock that meets the batch's
deadlines.

Score (one priority queue of runnable decodes and pending prefills), per task, at the view's clock and SM share::

    Score = Latency / (Slack - beta * Age)

* Latency: the task's own time from the LUT's step-law coefficients (`FestinaLUT.coeffs`, the exact laws the LUT
  was profiled from): a decode, one decode step alone at its context (``tau0 + tau2 + tau3 (computed + 1)``); a
  prefill, its remaining prefill alone, in chunks of the token budget (``ceil(r / B) tau0 + tau1 r + tau4 A``, A
  the attention pairs of positions ``computed + 1 .. computed + r``).
* Deadline and Slack = deadline - now - Latency. A prefill (no token yet): its TTFT deadline, arrival + the TTFT
  SLO of its class (Table 2 via `commitenv.latency_slo`, class from the prompt and the *predicted* output). A
  decode: its next-token deadline, the paper's per-token TBT, its previous token's time (``last_token_s`` in the
  view) + its class's TBT SLO, and no later than its visible end-to-end deadline spread over its predicted
  remaining tokens allows: ``min(last + TBT SLO, now + (visible deadline - now) / max(predicted - generated, 1))``
  (the second term is this adaptation's: the scenario's end-to-end deadline is an SLO too). A task that already
  has tokens but must recompute its prompt (after a vLLM preemption) is scored like a prefill with the decode's
  next-token deadline.
* Age = now - arrival (for every task, as the view gives it). ``beta`` defaults to 0.1 (assumption: the paper
  leaves it unstated, only "small"). Note that for decodes, whose slack is at most the 100 ms TBT SLO, a
  request older than about ``0.1 / beta`` seconds has a non-positive denominator, so long-lived decodes end up
  ordered by earliest next-token deadline among the most urgent tasks.
* A non-positive denominator means most urgent: score +inf. Order: mis-predicted requests first (below), then by
  descending score, then earliest deadline, then slot.

Mis-predictions (paper: "assigns the highest priority to the mispredicted request"): a request whose generated
tokens reached its predicted output length and is still running (the prediction was short) goes first. The
paper's second remedy, evicting the running request of least recomputation cost when memory stays short, is not
available to a plan (the engine never preempts for a plan; only its vLLM fallback preempts, when a plan fills
nothing).

Batch filling. The plan lists *all* the replica's tasks in that order; the engine fills the step from it (each
task ``min(tokens left, budget left)`` tokens if its KV blocks and, for a waiting task, the sequence cap allow,
else skipped: the paper's bypass of a task that does not fit, "P1 skipped, P3 dispatched"). The policy replays
the same fill on the view (token budget, free KV blocks, sequence cap; prefix-cache hits and a draining replica's
admission rule are not visible to it) to get the candidate batch and its step-law terms: prefill tokens P, attention
pairs A (a chunk of k tokens after c computed ones: ``k c + k (k + 1) / 2``), decodes n and their summed context L
(``computed + 1`` each).

Frequency sweep (runtime resource allocation). Adaptation: in this engine an SM share belongs to a model instance
(set by the interval action), not to a task, and one step runs all its tasks at the instance's share. So the
sweep chooses the *clock*; the SM side is reported, not applied: ``needed_share``, the least LUT grid share at
which the candidate batch would meet its deadlines at the chosen clock, for the controller to use at the next
interval. For every clock level of the GPU that is on the LUT grid, at the instance's share:

* step time ``t_f = step_time(P, n, L, A)`` (the whole step at f, as in steady state; the step that starts now
  actually runs at the current clock, a requested clock applying after the profile's clock-change latency);
* feasible when every task of the batch meets its deadline: a decode, ``now + t_f <=`` its next token's TBT
  deadline (previous token + 100 ms) and ``now + t_f x (predicted remaining tokens) <=`` its visible end-to-end
  deadline; a prefill (or recompute),
  ``now + t_f + later <=`` its deadline, ``later`` its remaining chunks after this step, each a step of
  ``min(rest, budget - n)`` of its tokens carrying the batch's decode terms (``tau0 + tau2 n + tau3 L``);
* predicted energy ``E_f = step_energy(P, n, L, A)``. The profile's step energy is the whole GPU's over the step,
  so it already carries the GPU's idle floor over the step time (`commitenv.sim.coeffs`: "the idle floor the step
  carries grows with its duration"); nothing is added to it, which would count the floor twice.

The lowest-energy feasible clock is chosen (ties: the lower clock); none feasible -> the top clock. With no
candidate batch (nothing fits: the engine then falls back to vLLM) no clock is requested.

One shared operating point: the clock is a GPU's, shared by its instances. The policy keeps each replica's latest
choice per GPU and requests the highest choice of the GPU's replicas that planned within ``vote_window_s``, so one
instance's low-energy clock does not starve a co-resident instance that needs a higher one (with one instance per
GPU this is the replica's own choice).

Clocks and shares that are not LUT grid values snap down to the nearest grid value (the lowest when below the
grid), as in `commitenv_controllers.festina.dispatch`: a slower operating point, conservative for the deadline
checks.

Readable by the controller: ``last`` (replica -> `FestinaStep`, the latest decision), ``usage`` (busy time and
clock choices, `reset_usage`) and ``peak_share`` (replica -> the largest ``needed_share`` since `reset_peaks`, 1.0
counted when infeasible at every clock); ``calls``.

Known consequences of these choices: a prefill past its TTFT deadline has score +inf and the earliest deadline,
so under overload late prefills go ahead of decodes, and with a small token budget the decodes then wait (their
TBT suffers). The per-step TBT check makes any step that carries decodes and a chunk too long for 100 ms
infeasible at every clock (top clock), where the paper would give the prefill its own SM partition. The chosen
clock is requested every step without hysteresis; with a clock-change latency, steps run at the previous clock
meanwhile. A step whose prefill chunks would make a decode miss its next-token deadline at the clock it runs at is
cut (`FestinaLocal.cap_chunks`: decodes first, the plan's ``token_budget`` the largest that keeps their deadlines;
``capped`` counts such steps). Without it a 4,000-token chunk started at 705 MHz held every decode of its instance
for 0.44 s.

Cost per call: O(N log N) for N tasks (scores, sort, fill) plus O(|F| (1 + prefills in the batch)) for the sweep
and O(|S| (1 + prefills)) for ``needed_share``. The algorithm is compiled (`local_core`, numba) and the engine's loop
calls it in place, without a call back to Python per step (`commitenv.sim.local_compiled`); `FestinaLocal.plan` runs
the same compiled functions on a view's records. A subclass that overrides `plan` is called back on the host.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from commitenv.latency_slo import INPUT_EDGES, OUTPUT_EDGES, TBT_SLO_S, TTFT_SLO_S
from commitenv.sim.coeffs import StepCoeffs
from commitenv.sim.local import LocalPolicy, LocalView, StepPlan
from commitenv.sim.local_compiled import OUT_HEADER, CompiledPlan, compile_plan

from . import local_core as core
from .lut import FestinaLUT


def slo_class_of(prompt_tokens: int, output_tokens: int) -> int:
    """Scalar `commitenv.latency_slo.slo_class`: 0 short, 1 medium, 2 long."""
    return max(bisect_right(INPUT_EDGES, prompt_tokens), bisect_right(OUTPUT_EDGES, output_tokens))


class TaskScore(NamedTuple):
    """A task's place in the priority queue."""

    slot: int
    latency_s: float
    deadline_s: float
    slack_s: float
    age_s: float
    score: float  # +inf: most urgent
    mispredicted: bool


class Batch(NamedTuple):
    """The candidate batch the engine would fill from an order, with its step-law terms and deadlines."""

    slots: tuple[int, ...]
    tokens: tuple[int, ...]
    P: int
    A: int
    n: int
    L: int
    decode_tbt_s: float  # least time left to its decodes' next-token deadlines, last token + TBT SLO - now (inf: none)
    decode_budget_s: float  # least (visible deadline - now) / predicted remaining tokens of its decodes (inf: none)
    prefills: tuple[tuple[float, int, int], ...]  # per prefill chunk: (deadline, tokens left after it, history)


class FestinaStep(NamedTuple):
    """A planning decision."""

    t: float
    replica: int
    gpu: int
    batch: tuple[int, ...]  # slots of the predicted step
    clock_mhz: int | None  # this replica's choice (None: no batch predicted)
    gpu_clock_mhz: int | None  # requested for the GPU: the highest recent choice of its replicas
    feasible: bool
    energy_j: float  # predicted energy of the step at clock_mhz (NaN without a batch)
    step_s: float  # predicted step time at clock_mhz (NaN without a batch)
    needed_share: float | None  # least grid share meeting the deadlines at clock_mhz (None: none does)


def _task_arrays(view: LocalView) -> tuple[np.ndarray, np.ndarray]:
    """A view's tasks as the compiled loop hands them over (`commitenv.sim.local_compiled`: ``ints``, ``flts``)."""
    ints = np.array([(0, t.slot, t.running, t.decode, t.tokens_left, t.computed, t.prompt_tokens, t.generated,
                      t.predicted_output_tokens, t.blocks) for t in view.tasks], np.int64).reshape(-1, 10)
    flts = np.array([(t.arrival_s, t.visible_deadline_s, t.last_token_s) for t in view.tasks],
                    np.float64).reshape(-1, 3)
    return ints, flts


class FestinaLocal(LocalPolicy):
    """Festina's local scheduler (sec. 3.4); see the module docstring.

    ``lut``: the model's `FestinaLUT`, or a sequence of them indexed by the view's model; ``beta``: the age weight
    of the score (0.1); ``vote_window_s``: how long a replica's clock choice counts for its GPU (0.25 s)."""

    name = "festina_local"

    def __init__(self, lut: FestinaLUT | Sequence[FestinaLUT], beta: float = 0.1, vote_window_s: float = 0.25) -> None:
        if not (math.isfinite(beta) and beta >= 0):
            raise ValueError(f"beta: a finite value >= 0 expected, got {beta}")
        if not (math.isfinite(vote_window_s) and vote_window_s >= 0):
            raise ValueError(f"vote_window_s: a finite value >= 0 expected, got {vote_window_s}")
        self.luts: tuple[FestinaLUT, ...] = (lut,) if isinstance(lut, FestinaLUT) else tuple(lut)
        if not self.luts:
            raise ValueError("lut: at least one FestinaLUT expected")
        self.beta = float(beta)
        self.vote_window_s = float(vote_window_s)
        self._pf, self._pi = self._parameters()
        self._sf = np.zeros((0, core.N_S))
        self._si = np.zeros((1, core.N_J), np.int64)
        self._sizes = (0, 0, 0)

    # ------------------------------------------------------------------------------------------ the arrays
    def _parameters(self) -> tuple[np.ndarray, np.ndarray]:
        """``pf`` and ``pi`` (`local_core`): the SLOs, beta, the vote window, every LUT's grid and coefficients."""
        grids = [lut.grid for lut in self.luts]
        m, nc, ns = len(grids), max(len(g.clocks_mhz) for g in grids), max(len(g.shares) for g in grids)
        pf = np.full((1 + 2 * m + m * nc * ns, max(core.N_P, core.N_C, nc, ns)), np.inf)
        pf[0, :core.N_P] = (self.beta, self.vote_window_s, *TTFT_SLO_S, *TBT_SLO_S, *INPUT_EDGES, *OUTPUT_EDGES)
        pi = np.zeros((m + 1, 2), np.int64)
        pi[m] = nc, ns
        fields = ("tau0", "tau1", "tau2", "tau3", "tau4", "a", "c1", "c2", "b", "kappa")
        for i, (lut, g) in enumerate(zip(self.luts, grids)):
            pi[i] = len(g.clocks_mhz), len(g.shares)
            pf[1 + i, :len(g.clocks_mhz)] = g.clocks_mhz
            pf[1 + m + i, :len(g.shares)] = g.shares
            for ci, c in enumerate(g.clocks_mhz):
                for sj, s in enumerate(g.shares):
                    k = lut.coeffs(c, s)
                    pf[1 + 2 * m + (i * nc + ci) * ns + sj, :core.N_C] = [getattr(k, f) for f in fields]
        return pf, pi

    def _ensure(self, replicas: int, gpus: int, max_seqs: int) -> None:
        """Grow the state arrays to hold ``replicas`` replicas on ``gpus`` GPUs and batches of ``max_seqs`` (what they
        hold is kept; nothing shrinks)."""
        r0, g0, s0 = self._sizes
        r, g, s = max(r0, replicas), max(g0, gpus), max(s0, max_seqs)
        if (r, g, s) == (r0, g0, s0):
            return
        sf = np.zeros((r + 2 * g, max(core.N_S, r)))
        sf[r:r + g] = -np.inf  # vote times: none
        sf[:r0, :core.N_S] = self._sf[:r0, :core.N_S]
        sf[r:r + g0, :r0] = self._sf[r0:r0 + g0, :r0]
        sf[r + g:r + g + g0, :r0] = self._sf[r0 + g0:r0 + 2 * g0, :r0]
        si = np.zeros((r + 1, core.N_J + s), np.int64)
        si[:r0, :core.N_J + s0] = self._si[:r0]
        si[r] = 0
        si[r, :2] = self._si[r0, :2]
        self._sf, self._si, self._sizes = sf, si, (r, g, s)

    def compiled(self, replicas: int, gpus: int, max_seqs: int) -> CompiledPlan | None:
        if type(self).plan is not FestinaLocal.plan:
            return None  # (a subclass that changes the plan is called back on the host)
        self._ensure(replicas, gpus, max_seqs)
        return CompiledPlan(compile_plan(core.festina_plan), self._pf, self._pi, self._sf, self._si)

    # ------------------------------------------------------------------------------------------ look-ups
    def _model(self, model: int) -> int:
        if len(self.luts) == 1:
            return 0
        if not 0 <= model < len(self.luts):
            raise ValueError(f"festina local: no LUT for model {model} (have {len(self.luts)})")
        return model

    def coeffs(self, model: int, clock_mhz: float, share: float) -> StepCoeffs:
        """The LUT's step-law coefficients at (clock, share), each snapped down to the LUT grid."""
        m = self._model(model)
        off = core.coeff_row(m, clock_mhz, share, self._pf, self._pi) - (1 + 2 * (self._pi.shape[0] - 1))
        nc, ns = self._pi[-1]
        g = self.luts[m].grid
        return self.luts[m].coeffs(g.clocks_mhz[off // ns % nc], g.shares[off % ns])

    def _check_clocks(self, model: int, clocks_mhz: Sequence[int]) -> None:
        grid = self.luts[model].grid.clocks_mhz
        if not any(c in grid for c in clocks_mhz):
            raise ValueError(f"festina local: none of the GPU's clocks {list(clocks_mhz)} is on the LUT grid "
                             f"{list(grid)}")

    # ------------------------------------------------------------------------------------------ the score and batch
    def scores(self, view: LocalView) -> list[TaskScore]:
        """Every task's score at the view's clock and share, in the view's order."""
        ints, flts = _task_arrays(view)
        lat, dl, slack, age, key, fine = core.scores(view.t, self._model(view.model), view.clock_mhz, view.share,
                                                     view.token_budget, ints, flts, self._pf, self._pi)
        return [TaskScore(t.slot, float(lat[i]), float(dl[i]), float(slack[i]), float(age[i]), float(-key[i]),
                          not fine[i]) for i, t in enumerate(view.tasks)]

    def priority(self, view: LocalView) -> tuple[int, ...]:
        """Slots by priority: mis-predicted first, then descending score, earliest deadline, slot."""
        ints, flts = _task_arrays(view)
        idx = core.priority(view.t, self._model(view.model), view.clock_mhz, view.share, view.token_budget, ints,
                            flts, self._pf, self._pi)
        return tuple(int(view.tasks[i].slot) for i in idx)

    def batch(self, view: LocalView, order: Sequence[int]) -> Batch:
        """The step the engine would fill from ``order`` (slots; `Replica.schedule_ordered` replayed on the view)."""
        ints, flts = _task_arrays(view)
        where = {t.slot: i for i, t in enumerate(view.tasks)}
        rows, pre = np.empty((len(view.tasks), 2), np.int64), np.empty((len(view.tasks), 3))
        nb, npre, P, A, n, L, dec_tbt, dec_budget = core.fill(
            view.t, np.array([where[s] for s in order], np.int64), view.token_budget, view.free_kv_blocks,
            view.block_tokens, view.max_seqs, ints, flts, self._pf, rows, pre)
        return Batch(tuple(int(ints[i, 1]) for i in rows[:nb, 0]), tuple(int(k) for k in rows[:nb, 1]), P, A, n, L,
                     dec_tbt, dec_budget, tuple((float(d), int(r), int(h)) for d, r, h in pre[:npre]))

    @staticmethod
    def feasible(k: StepCoeffs, batch: Batch, now: float, token_budget: int) -> tuple[bool, float]:
        """Whether every task of ``batch`` meets its deadline under coefficients ``k``, and the step time."""
        kv = np.array([k.tau0, k.tau1, k.tau2, k.tau3, k.tau4, k.a, k.c1, k.c2, k.b, k.kappa])
        pre = np.array(batch.prefills, np.float64).reshape(-1, 3)
        ok, t = core.feasible(kv, batch.P, batch.A, batch.n, batch.L, batch.decode_tbt_s, batch.decode_budget_s, pre,
                              len(pre), now, token_budget)
        return bool(ok), float(t)

    # ------------------------------------------------------------------------------------------ the plan
    def plan(self, view: LocalView) -> StepPlan:
        model = self._model(view.model)
        self._check_clocks(model, view.clocks_mhz)
        self._ensure(view.replica + 1, view.gpu + 1, view.max_seqs)
        ints, flts = _task_arrays(view)
        levels = np.array(view.clocks_mhz, np.int64)
        out = np.empty(len(view.tasks) + OUT_HEADER, np.int64)
        n = core.plan_core(view.t, view.replica, view.gpu, model, view.clocks_mhz.index(view.clock_mhz), levels,
                           view.share, view.free_kv_blocks, view.block_tokens, view.token_budget, view.max_seqs, ints,
                           flts, self._pf, self._pi, self._sf, self._si, out)
        order = tuple(int(view.tasks[i].slot) for i in out[OUT_HEADER:OUT_HEADER + n])
        clock = int(levels[out[0]]) if out[0] >= 0 else None
        return StepPlan(order, clock, int(out[1]) or None)

    # ------------------------------------------------------------------------------------------ what it recorded
    @property
    def calls(self) -> int:
        """Plans made (in the loop or through `plan`)."""
        return int(self._si[-1, core.K_CALLS])

    @property
    def capped(self) -> int:
        """Steps whose token budget was cut to keep the decodes' next-token deadlines."""
        return int(self._si[-1, core.K_CAPPED])

    @property
    def last(self) -> dict[int, FestinaStep]:
        """Replica -> its latest decision."""
        out = {}
        for r in np.flatnonzero(self._si[:-1, core.J_HAS]).tolist():
            i, f = self._si[r], self._sf[r]
            clock, gpu_clock, need = int(i[core.J_CLOCK]), int(i[core.J_GPU_CLOCK]), float(f[core.S_NEED])
            out[r] = FestinaStep(float(f[core.S_T]), r, int(i[core.J_GPU]),
                                 tuple(i[core.N_J:core.N_J + i[core.J_BATCH_N]].tolist()),
                                 None if clock < 0 else clock, None if gpu_clock < 0 else gpu_clock,
                                 bool(i[core.J_FEASIBLE]), float(f[core.S_ENERGY]), float(f[core.S_STEP]),
                                 None if math.isnan(need) else need)
        return out

    @property
    def peak_share(self) -> dict[int, float]:
        """Replica -> the largest ``needed_share`` since `reset_peaks` (1.0 counted when infeasible at every clock)."""
        peaks = self._sf[:self._sizes[0], core.S_PEAK]
        return {int(r): float(peaks[r]) for r in np.flatnonzero(peaks > 0)}

    @property
    def usage(self) -> dict[int, tuple[float, float, float]]:
        """Replica -> (busy s, sum of clock x s, sum of needed share x s) since `reset_usage`."""
        u = self._sf[:self._sizes[0]]
        return {int(r): (float(u[r, core.S_BUSY]), float(u[r, core.S_FSUM]), float(u[r, core.S_SSUM]))
                for r in np.flatnonzero(u[:, core.S_BUSY] > 0)}

    def reset_usage(self) -> dict[int, tuple[float, float, float]]:
        """Hand over, per replica since the last reset, its planned busy seconds and the busy-time-weighted means of
        its own clock choices (its preferred frequency F_l, sec. 3.5) and of its needed SM share (SM_l), and clear
        them."""
        out = {r: (b, f / b, s / b) for r, (b, f, s) in self.usage.items()}
        self._sf[:self._sizes[0], core.S_BUSY:core.S_SSUM + 1] = 0.0
        return out

    def reset_peaks(self) -> dict[int, float]:
        """Hand over ``peak_share`` (replica -> largest needed share since the last reset) and clear it."""
        out = self.peak_share
        self._sf[:self._sizes[0], core.S_PEAK] = 0.0
        return out
