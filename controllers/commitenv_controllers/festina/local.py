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
and O(|S| (1 + prefills)) for ``needed_share``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import NamedTuple

from commitenv.latency_slo import INPUT_EDGES, OUTPUT_EDGES, TBT_SLO_S, TTFT_SLO_S
from commitenv.sim.coeffs import StepCoeffs
from commitenv.sim.local import LocalPolicy, LocalView, StepPlan, TaskView

from .lut import FestinaLUT

_INF = math.inf
_EPS = 1e-12  # slack on the time comparisons
_IN0, _IN1 = INPUT_EDGES
_OUT0, _OUT1 = OUTPUT_EDGES


def slo_class_of(prompt_tokens: int, output_tokens: int) -> int:
    """Scalar `commitenv.latency_slo.slo_class`: 0 short, 1 medium, 2 long."""
    return max(bisect_right(INPUT_EDGES, prompt_tokens), bisect_right(OUTPUT_EDGES, output_tokens))


def step_time(k: StepCoeffs, batch: "Batch") -> float:
    """The step law's time of ``batch`` under coefficients ``k``."""
    return k.tau0 + k.tau1 * batch.P + k.tau2 * batch.n + k.tau3 * batch.L + k.tau4 * batch.A


def pairs_between(history: int, tokens: int) -> int:
    """Attention pairs of ``tokens`` prompt positions after ``history`` computed ones (however they are chunked)."""
    return (history + tokens) * (history + tokens + 1) // 2 - history * (history + 1) // 2


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
        self.last: dict[int, FestinaStep] = {}
        self.peak_share: dict[int, float] = {}
        self.usage: dict[int, tuple[float, float, float]] = {}  # replica -> (busy s, sum clock x s, sum share x s)
        self.calls = 0
        self.capped = 0  # steps whose token budget was cut to keep the decodes' next-token deadlines (`cap_chunks`)
        self._votes: dict[int, dict[int, tuple[float, int]]] = {}  # gpu -> replica -> (t, clock)
        self._k: dict[tuple[int, float, float], StepCoeffs] = {}
        self._clocks: dict[tuple[int, tuple[int, ...]], tuple[int, ...]] = {}
        # (the sweep's look-ups, built once: its clocks' coefficients at a share, and a clock's at every grid share)
        self._sweep_k: dict[tuple[int, tuple[int, ...], float], tuple[tuple[int, StepCoeffs], ...]] = {}
        self._share_k: dict[tuple[int, int], tuple[tuple[float, StepCoeffs], ...]] = {}

    # ------------------------------------------------------------------------------------------ look-ups
    def _lut(self, model: int) -> FestinaLUT:
        if len(self.luts) == 1:
            return self.luts[0]
        if not 0 <= model < len(self.luts):
            raise ValueError(f"festina local: no LUT for model {model} (have {len(self.luts)})")
        return self.luts[model]

    def coeffs(self, model: int, clock_mhz: float, share: float) -> StepCoeffs:
        """The LUT's step-law coefficients at (clock, share), each snapped down to the LUT grid."""
        key = (model, clock_mhz, share)
        k = self._k.get(key)
        if k is None:
            lut = self._lut(model)
            g = lut.grid
            c = g.clocks_mhz[max(bisect_right(g.clocks_mhz, clock_mhz + 1e-9) - 1, 0)]
            s = g.shares[max(bisect_right(g.shares, share + 1e-6) - 1, 0)]
            k = self._k[key] = lut.coeffs(c, s)
        return k

    def sweep_clocks(self, model: int, clocks_mhz: tuple[int, ...]) -> tuple[int, ...]:
        """The GPU's clock levels on the LUT grid, ascending (ValueError when none is)."""
        key = (model, clocks_mhz)
        out = self._clocks.get(key)
        if out is None:
            grid = self._lut(model).grid.clocks_mhz
            out = tuple(sorted(c for c in clocks_mhz if c in grid))
            if not out:
                raise ValueError(f"festina local: none of the GPU's clocks {list(clocks_mhz)} is on the LUT grid "
                                 f"{list(grid)}")
            self._clocks[key] = out
        return out

    # ------------------------------------------------------------------------------------------ the score
    def _rows(self, view: LocalView) -> list[tuple]:
        """Per task, its sort key and score parts: (not mis-predicted, -score, deadline, slot, latency, slack,
        age, task). Sorting the rows gives the priority order (slots are unique, so no tie reaches the rest)."""
        k = self.coeffs(view.model, view.clock_mhz, view.share)
        tau0, tau1, tau4 = k.tau0, k.tau1, k.tau4
        dec0, tau3 = k.tau0 + k.tau2, k.tau3
        now, beta, B = view.t, self.beta, view.token_budget
        ttft, tbt = TTFT_SLO_S, TBT_SLO_S
        rows = []
        for task in view.tasks:
            slot, _, decode, left, h, p, g, o, arrival, visible, _, last = task
            ci = 0 if p < _IN0 else (1 if p < _IN1 else 2)
            co = 0 if o < _OUT0 else (1 if o < _OUT1 else 2)
            cls = max(co, ci)
            if decode:
                lat = dec0 + tau3 * (h + 1)
            else:
                lat = -(-left // B) * tau0 + tau1 * left + tau4 * ((h + left) * (h + left + 1) // 2 - h * (h + 1) // 2)
            if g == 0:
                deadline = arrival + ttft[cls]
            else:
                rem = o - g
                per = (visible - now) / max(1, rem)
                deadline = min(last + tbt[cls], now + per)
            slack = deadline - now - lat
            age = now - arrival
            den = slack - beta * age
            rows.append((g < 1 or g < o, -lat / den if den > 0 else -_INF, deadline, slot, lat, slack, age, task))
        return rows

    def scores(self, view: LocalView) -> list[TaskScore]:
        """Every task's score at the view's clock and share, in the view's order."""
        return [TaskScore(r[3], r[4], r[2], r[5], r[6], -r[1], not r[0]) for r in self._rows(view)]

    @staticmethod
    def priority(scores: list[TaskScore]) -> tuple[int, ...]:
        """Slots by priority: mis-predicted first, then descending score, earliest deadline, slot."""
        return tuple(s.slot for s in sorted(scores, key=lambda s: (not s.mispredicted, -s.score, s.deadline_s,
                                                                   s.slot)))

    # ------------------------------------------------------------------------------------------ the batch
    @staticmethod
    def batch(view: LocalView, order: Sequence[int]) -> Batch:
        """The step the engine would fill from ``order`` (`Replica.schedule_ordered` replayed on the view)."""
        tasks = {t.slot: t for t in view.tasks}
        return FestinaLocal._fill(view, [tasks[s] for s in order])

    @staticmethod
    def _fill(view: LocalView, ordered: Sequence[TaskView]) -> Batch:
        budget = view.token_budget
        free = view.free_kv_blocks
        bs = view.block_tokens
        cap = view.max_seqs
        running = run_left = sum(1 for t in view.tasks if t.running)
        now = view.t
        slots, toks, pre = [], [], []
        P = A = n = L = 0
        dec_tbt = dec_budget = _INF
        tbt = TBT_SLO_S
        for t in ordered:
            if budget <= 0 or (run_left == 0 and running >= cap):
                break  # nothing more fits: no budget left, or only waiting tasks left and the sequence cap reached
            slot, run, decode, left, h, p, g, o, arrival, visible, blocks, last = t
            kk = min(budget, left)
            need = -(-(h + kk) // bs) - blocks
            if run:
                run_left -= 1
                if need > free:
                    continue
            else:
                if running >= cap or need > free:
                    continue
                running += 1
            free -= need
            budget -= kk
            slots.append(slot)
            toks.append(kk)
            ci = 0 if p < _IN0 else (1 if p < _IN1 else 2)
            co = 0 if o < _OUT0 else (1 if o < _OUT1 else 2)
            cls = max(co, ci)
            rem = max(1, o - g)
            if decode:
                n += 1
                L += h + 1
                per = (visible - now) / rem
                dec_budget = min(dec_budget, per)
                dec_tbt = min(dec_tbt, last + tbt[cls] - now)
            else:
                P += kk
                A += kk * h + kk * (kk + 1) // 2
                if g == 0:
                    deadline = arrival + TTFT_SLO_S[cls]
                else:
                    per = (visible - now) / rem
                    deadline = min(last + tbt[cls], now + per)
                pre.append((deadline, left - kk, h + kk))
        return Batch(tuple(slots), tuple(toks), P, A, n, L, dec_tbt, dec_budget, tuple(pre))

    # ------------------------------------------------------------------------------------------ the sweep
    @staticmethod
    def feasible(k: StepCoeffs, batch: Batch, now: float, token_budget: int) -> tuple[bool, float]:
        """Whether every task of ``batch`` meets its deadline under coefficients ``k``, and the step time."""
        n, L = batch.n, batch.L
        t = step_time(k, batch)
        if t > batch.decode_tbt_s + _EPS or t > batch.decode_budget_s + _EPS:
            return False, t
        if batch.prefills:
            ride = k.tau0 + k.tau2 * n + k.tau3 * L
            chunk = max(token_budget - n, 1)
            for deadline, r, h in batch.prefills:
                later = 0.0 if r <= 0 else (-(-r // chunk) * ride + k.tau1 * r + k.tau4 * pairs_between(h, r))
                if now + t + later > deadline + _EPS:
                    return False, t
        return True, t

    def _sweep_coeffs(self, model: int, clocks_mhz: tuple[int, ...], share: float) -> tuple[tuple[int, StepCoeffs], ...]:
        """(clock, coefficients) at ``share`` for every clock of the sweep (`sweep_clocks`), ascending."""
        key = (model, clocks_mhz, share)
        out = self._sweep_k.get(key)
        if out is None:
            out = self._sweep_k[key] = tuple((c, self.coeffs(model, c, share))
                                             for c in self.sweep_clocks(model, clocks_mhz))
        return out

    def _share_coeffs(self, model: int, clock_mhz: int) -> tuple[tuple[float, StepCoeffs], ...]:
        """(share, coefficients) at a grid clock for every grid share, ascending."""
        key = (model, clock_mhz)
        out = self._share_k.get(key)
        if out is None:
            lut = self._lut(model)
            out = self._share_k[key] = tuple((s, lut.coeffs(clock_mhz, s)) for s in lut.grid.shares)
        return out

    def sweep(self, view: LocalView, batch: Batch) -> tuple[int, bool, float, float, float | None]:
        """The frequency sweep over ``batch``: (clock, feasible, energy J, step time s, needed share)."""
        now, B, model = view.t, view.token_budget, view.model
        P, A, n, L = batch.P, batch.A, batch.n, batch.L
        best = None
        feasible = self.feasible
        ks = self._sweep_coeffs(model, view.clocks_mhz, view.share)
        for c, k in ks:
            ok, t = feasible(k, batch, now, B)
            if ok:
                e = k.a + k.c1 * P + k.c2 * A + k.b * n + k.kappa * L
                if best is None or e < best[2] - _EPS:
                    best = (c, True, e, t)
        if best is None:
            c, k = ks[-1]
            t = step_time(k, batch)
            return c, False, k.a + k.c1 * P + k.c2 * A + k.b * n + k.kappa * L, t, None
        c = best[0]
        need = None
        for s, k in self._share_coeffs(model, c):
            if feasible(k, batch, now, B)[0]:
                need = s
                break
        return c, True, best[2], best[3], need

    # ------------------------------------------------------------------------------------------ the plan
    def plan(self, view: LocalView) -> StepPlan:
        self.calls += 1
        if not view.tasks:
            return StepPlan(())
        rows = self._rows(view)
        rows.sort()
        order = tuple(r[3] for r in rows)
        batch = self._fill(view, [r[7] for r in rows])
        if not batch.slots:
            self.last[view.replica] = FestinaStep(view.t, view.replica, view.gpu, (), None, None, False, math.nan,
                                                  math.nan, None)
            return StepPlan(order)
        clock, ok, energy, step_s, need = self.sweep(view, batch)
        votes = self._votes.setdefault(view.gpu, {})
        votes[view.replica] = (view.t, clock)
        lo = view.t - self.vote_window_s
        gpu_clock = max(c for t, c in votes.values() if t >= lo)
        budget = None
        capped = self.cap_chunks(view, rows, batch)
        if capped is not None:
            order, batch, budget = capped
            k = self.coeffs(view.model, view.clock_mhz, view.share)
            energy = k.a + k.c1 * batch.P + k.c2 * batch.A + k.b * batch.n + k.kappa * batch.L
            step_s = step_time(k, batch)
            self.capped += 1
        self.last[view.replica] = FestinaStep(view.t, view.replica, view.gpu, batch.slots, clock, gpu_clock, ok,
                                              energy, step_s, need)
        peak = 1.0 if need is None else need
        if peak > self.peak_share.get(view.replica, 0.0):
            self.peak_share[view.replica] = peak
        busy, fsum, ssum = self.usage.get(view.replica, (0.0, 0.0, 0.0))
        self.usage[view.replica] = (busy + step_s, fsum + clock * step_s, ssum + peak * step_s)
        return StepPlan(order, gpu_clock, budget)

    def cap_chunks(self, view: LocalView, rows: list[tuple], batch: Batch) -> tuple[tuple[int, ...], Batch, int] | None:
        """Stall-free batching (sec. 3.4: a decode's short steps progress while long prompts are present): the step
        that starts now runs at the *current* clock and share (a requested clock applies after the clock-change
        latency), so when its prefill chunks would make a decode miss its next-token deadline there, the decodes go
        first and the step's token budget is the largest that keeps every decode's deadline (the prefills take the
        rest; the decodes alone when even one prefill token is too many). None: the batch keeps the deadlines."""
        if not (batch.n and batch.P):
            return None
        k = self.coeffs(view.model, view.clock_mhz, view.share)
        if step_time(k, batch) <= min(batch.decode_tbt_s, batch.decode_budget_s) + _EPS:
            return None
        tasks = [r[7] for r in rows]
        ordered = [t for t in tasks if t.decode] + [t for t in tasks if not t.decode]

        def fill(b: int) -> Batch:
            return self._fill(view._replace(token_budget=b), ordered)

        alone = fill(view.token_budget)
        lo = max(alone.n, 1)  # the decodes alone (each one token)
        # no more prefill tokens than the batch had, nor than the time left allows at tau1 alone (the attention term
        # only adds time): the search's upper end
        room = min(alone.decode_tbt_s, alone.decode_budget_s) - (k.tau0 + k.tau2 * alone.n + k.tau3 * alone.L)
        p_max = batch.P if k.tau1 <= 0 else min(batch.P, max(int(room / k.tau1) + 1, 0))
        hi = max(min(view.token_budget, lo + p_max), lo)
        while lo < hi:  # the largest budget whose step meets the decodes' deadlines (the step time grows with it)
            mid = (lo + hi + 1) // 2
            b = fill(mid)
            if step_time(k, b) <= min(b.decode_tbt_s, b.decode_budget_s) + _EPS:
                lo = mid
            else:
                hi = mid - 1
        return tuple(t.slot for t in ordered), fill(lo), lo

    def reset_usage(self) -> dict[int, tuple[float, float, float]]:
        """Hand over, per replica since the last reset, its planned busy seconds and the busy-time-weighted means of
        its own clock choices (its preferred frequency F_l, sec. 3.5) and of its needed SM share (SM_l), and clear
        them."""
        out = {r: (b, f / b, s / b) for r, (b, f, s) in self.usage.items() if b > 0}
        self.usage = {}
        return out

    def reset_peaks(self) -> dict[int, float]:
        """Hand over ``peak_share`` (replica -> largest needed share since the last reset) and clear it."""
        out, self.peak_share = self.peak_share, {}
        return out
