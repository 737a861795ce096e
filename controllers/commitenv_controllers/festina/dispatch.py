"""Festina's global scheduler (paper sec. 3.3) as a commitenv dispatch policy: at every arrival, SLO-feasible
replicas at their current clocks, then the one of least estimated energy E^k = Power(f_k) x Latency(f_k, S_k,
Req_in, Req_out) (LUT, sec. 3.2), with the stability tie-break; else the first replica, by earliest available
timestamp, that is feasible at the maximum clock; else a scale-out request.

Phases, per arrival (``now`` = the view's time, which is the arrival time; for a request re-dispatched when its
replica is deactivated it is the re-dispatch time, the arrival being unknown to the view, so the TTFT budget then
counts from the re-dispatch):

1. Feasibility (pooling). Padded output ``o = ceil(predicted x (1 + pad))``; memory demand ``d = ceil((prompt +
   o) / block_tokens)`` KV blocks. Per candidate replica, at its clock and SM share (both from the view):

   * ``T_avail`` (earliest time ``d`` blocks can be allocated): ``now`` when ``free_kv_blocks >= d``; never (inf)
     when ``d > kv_blocks``; otherwise ``now + min(1, deficit / occupied) x D``, with ``deficit = d - free``,
     ``occupied = kv_blocks - free`` and ``D`` the time the replica needs to drain its current work: its queued
     prefill (below) then ``K`` decode steps of all its requests (``running + waiting`` at summed context
     ``decode_context_tokens + queued_prefill_tokens``), where ``K``, the mean remaining output of a request in
     flight, is half the mean predicted output length of the arrivals seen so far (``residual_steps`` fixes it).
     The held blocks are taken to free up evenly over ``D`` (requests finish one after another). A router does
     not know the remaining outputs of the requests in flight, so this is a documented approximation.
   * queued prefill time ``t_q``: the ``queued_prefill_tokens`` ``P`` ahead of the request, split evenly over
     ``m = max(1, waiting)`` prompts, batched by the scheduler's token budget ``B`` as the engine does:
     ``ceil(P / B)`` steps of the profile's step law (``lut.coeffs``), carrying ``P`` prompt tokens, attention
     pairs ``m x p(p + 1) / 2`` (``p = P / m``) and, as riders in every step, the decoding requests (``running`` of
     them when ``decode_context_tokens > 0``, at that summed context).
   * ``SM_free``: the replica's SM share. In this engine a model instance is a replica with its own share of its
     GPU; its requests time-share that share (their contention is what ``t_q`` and the batch TBT below model), so
     the SMs a new request can use are the instance's share (with one full-share instance per GPU, the whole GPU).
   * Feasible when, starting at ``T_avail`` with the queued prefill ahead (``first = now + max(T_avail - now, t_q)
     + TTFT``, the prefill of ``t_q`` being the first part of ``D``), ``first - now <= TTFT SLO`` of the request's
     class (Table 2; class from prompt and the unpadded predicted output, `commitenv.latency_slo`); the batch TBT
     (one decode step of ``running + 1`` requests at summed context ``decode_context_tokens + prompt + 1``)
     ``<= TBT SLO``; and ``first + (o - 1) x TBT <= visible deadline``. TTFT is the LUT's (the request alone, sec.
     3.2); prompts outside the LUT's input range use the exact law (`FestinaLUT.prefill_time`).

2. Selection: least ``E^k = lut.energy(clock, share, prompt, o)`` (prompt clamped into the LUT's input range:
   the energy only ranks candidates, all queried at the same clamped length). Candidates within ``tie`` (2 %) of
   the least energy are ranked by most free KV memory (tokens), then largest ``SM_free``, then lowest index.

3. Fallback: no candidate feasible at its current clock -> candidates by ``T_avail`` (then index), each evaluated
   at the maximum clock (``T_avail``, queue and TTFT/TBT recomputed there; the clock change latency ignored); the
   first feasible one is chosen and its GPU recorded in ``boost_requests`` (a dispatch policy cannot change
   clocks: the controller's interval action does). None feasible even there -> the candidate with the earliest
   ``T_avail`` (then the earliest first token at the maximum clock, then index) and a scale-out request recorded
   (``scale_out_requests``, ``last_scale_out_t``, the ``scale_out`` callback): activating a GPU is again the
   controller's move.

Clocks and shares that are not LUT grid values snap down to the nearest grid value (the lowest when below the
grid): a slower operating point, conservative for the SLO checks.

Speed: per (clock, share) the TTFT and the LUT's energy terms over every integer prompt length up to the LUT's
longest are tabulated once (lazily, as plain lists), so a call is a few list look-ups and step-law evaluations per
candidate.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable

import numpy as np

from commitenv.latency_slo import INPUT_EDGES, OUTPUT_EDGES, TBT_SLO_S, TTFT_SLO_S
from commitenv.sim.coeffs import StepCoeffs
from commitenv.sim.dispatch import ArrivalView, CandidateView, DispatchPolicy

from .lut import FestinaLUT

PHASES = ("energy", "fallback_max_clock", "infeasible")
_EPS = 1e-12  # slack on the time comparisons
_INF = math.inf


class _Op:
    """One operating point (grid clock, grid share): step-law coefficients; TTFT over the prompt lengths 1..hi
    (``ttft[p - 1]``: the LUT's within its range lo..hi, the exact law below it); the LUT's energy terms over
    lo..hi (energy(p, o) = e0[p - lo] + (o - 1) e1[p - lo], linear in o)."""

    __slots__ = ("clock", "e0", "e1", "k", "share", "ttft")

    def __init__(self, lut: FestinaLUT, clock: int, share: float) -> None:
        lo, hi = lut.grid.input_lens[0], lut.grid.input_lens[-1]
        lens = np.arange(lo, hi + 1, dtype=np.float64)
        below = np.arange(1, lo, dtype=np.float64)
        self.clock = clock
        self.share = share
        self.k: StepCoeffs = lut.coeffs(clock, share)
        self.ttft: list[float] = (np.asarray(lut.prefill_time(clock, share, below)).tolist() if lo > 1 else []) + \
            np.asarray(lut.ttft(clock, share, lens)).tolist()
        e1 = np.asarray(lut.energy(clock, share, lens, 1))
        self.e0: list[float] = e1.tolist()
        self.e1: list[float] = (np.asarray(lut.energy(clock, share, lens, 2)) - e1).tolist()


class FestinaDispatch(DispatchPolicy):
    """Festina's frequency-aware, SLO-safe request dispatcher (sec. 3.3) over one model's LUT.

    ``lut``: the model's `FestinaLUT` (its grid must cover the pool's clocks and shares, else they snap down);
    ``pad``: output-length safety margin (5 %); ``tie``: relative energy band of the tie-break (2 %);
    ``max_clock_mhz``: the fallback clock (default: the LUT's top clock; must be a grid clock); ``scale_out``:
    called as ``scale_out(t, req)`` whenever a scale-out is requested; ``residual_steps``: a fixed estimate of
    the remaining decode steps of the requests in flight (default: half the running mean predicted output).

    Readable by the controller: ``decisions`` (calls per deciding phase, `PHASES`), ``scale_out_requests`` and
    ``last_scale_out_t``, ``boost_requests`` (GPU -> latest time a request was placed there on the promise of the
    maximum clock); `pop_requests` hands over and clears the requests since its last call."""

    name = "festina"
    wants_load = True

    def __init__(self, lut: FestinaLUT, pad: float = 0.05, tie: float = 0.02, max_clock_mhz: int | None = None,
                 scale_out: Callable[[float, ArrivalView], object] | None = None,
                 residual_steps: float | None = None) -> None:
        if not (math.isfinite(pad) and pad >= 0):
            raise ValueError(f"pad: a finite value >= 0 expected, got {pad}")
        if not (math.isfinite(tie) and tie >= 0):
            raise ValueError(f"tie: a finite value >= 0 expected, got {tie}")
        if residual_steps is not None and not (math.isfinite(residual_steps) and residual_steps >= 0):
            raise ValueError(f"residual_steps: a finite value >= 0 expected, got {residual_steps}")
        self.lut = lut
        self.pad = float(pad)
        self.tie = float(tie)
        top = lut.grid.clocks_mhz[-1] if max_clock_mhz is None else max_clock_mhz
        lut.clock_pos(top)  # raises with the grid clocks
        self.max_clock_mhz = int(top)
        self.scale_out = scale_out
        self.residual_steps = None if residual_steps is None else float(residual_steps)
        self.decisions: dict[str, int] = dict.fromkeys(PHASES, 0)
        self.scale_out_requests = 0
        self.last_scale_out_t: float | None = None
        self.boost_requests: dict[int, float] = {}
        self._pending_scale_out = 0
        self._lo, self._hi = lut.grid.input_lens[0], lut.grid.input_lens[-1]
        self._budget = lut.token_budget
        self._ops: dict[tuple[int, int], _Op] = {}  # by grid positions
        self._at: dict[tuple[float, float], _Op] = {}  # by the views' (clock, share)
        self._out_sum = 0.0
        self._out_n = 0

    # ------------------------------------------------------------------------------------------ public helpers
    def padded_output(self, predicted: int) -> int:
        """ceil(predicted x (1 + pad)), at least 1 (a hair below the product guards against float round-up)."""
        return max(1, math.ceil(predicted * (1.0 + self.pad) - 1e-9))

    def pop_requests(self) -> tuple[int, dict[int, float]]:
        """Scale-outs requested and GPUs asked to run at the maximum clock since the last call (then cleared)."""
        n, boosts = self._pending_scale_out, self.boost_requests
        self._pending_scale_out, self.boost_requests = 0, {}
        return n, boosts

    # ------------------------------------------------------------------------------------------ operating points
    def op(self, clock_mhz: float, share: float) -> _Op:
        """The tabulated operating point of a view's clock and share (snapped down onto the grid)."""
        key = (clock_mhz, share)
        hit = self._at.get(key)
        if hit is None:
            g = self.lut.grid
            ci = max(0, bisect_right(g.clocks_mhz, clock_mhz + 1e-9) - 1)
            si = max(0, bisect_right(g.shares, share + 1e-6) - 1)
            hit = self._ops.get((ci, si))
            if hit is None:
                hit = self._ops[ci, si] = _Op(self.lut, g.clocks_mhz[ci], g.shares[si])
            self._at[key] = hit
        return hit

    # ------------------------------------------------------------------------------------------ estimates
    def _estimate(self, o: _Op, c: CandidateView, now: float, demand: int, prompt: int,
                  residual: float) -> tuple[float, float, float]:
        """(T_avail, first-token time, batch TBT) of ``c`` at operating point ``o``."""
        k = o.k
        P = c.queued_prefill_tokens
        n_dec = c.running if c.decode_context_tokens > 0 else 0
        L_dec = c.decode_context_tokens
        if P > 0:
            m = max(1, c.waiting)
            p = P / m
            steps = -(-P // self._budget)
            t_q = steps * k.step_time(P / steps, n_dec, L_dec, m * p * (p + 1) / 2 / steps)
        else:
            t_q = 0.0
        free = c.free_kv_blocks
        if free >= demand:
            t_avail = now
        elif demand > c.kv_blocks:
            t_avail = _INF
        else:
            n_all = c.running + c.waiting
            drain = t_q + (residual * k.step_time(0, n_all, L_dec + P, 0) if n_all else 0.0)
            held = c.kv_blocks - free
            t_avail = now + min(1.0, (demand - free) / held) * drain
        if 1 <= prompt <= self._hi:
            ttft = o.ttft[prompt - 1]  # below the LUT's range: the exact law, tabulated
        else:
            ttft = self.lut.prefill_time(o.clock, o.share, prompt)  # above the LUT's range: the exact law
        wait = t_avail - now
        first = now + max(t_q, wait) + ttft
        tbt = k.step_time(0, c.running + 1, L_dec + prompt + 1, 0)
        return t_avail, first, tbt

    # ------------------------------------------------------------------------------------------ the policy
    def choose(self, req: ArrivalView, replicas: tuple[CandidateView, ...]) -> int:
        now = req.t
        prompt = req.prompt_tokens
        pred = req.predicted_output_tokens
        out = self.padded_output(pred)
        cls = max(bisect_right(INPUT_EDGES, prompt), bisect_right(OUTPUT_EDGES, pred))
        ttft_slo, tbt_slo = TTFT_SLO_S[cls], TBT_SLO_S[cls]
        deadline = req.visible_deadline_s
        self._out_sum += pred
        self._out_n += 1
        residual = self.residual_steps if self.residual_steps is not None else self._out_sum / self._out_n / 2
        pe = min(max(prompt, self._lo), self._hi) - self._lo  # energy at the prompt clamped into the LUT's range
        d_out = out - 1

        def feasible(first: float, tbt: float) -> bool:
            return (first - now <= ttft_slo + _EPS and tbt <= tbt_slo + _EPS
                    and first + d_out * tbt <= deadline + _EPS)

        # Phase 1 + 2: feasible at the current clocks, least energy
        avail: list[tuple[float, int, CandidateView]] = []
        cands: list[tuple[float, CandidateView]] = []
        e_min = _INF
        for pos, c in enumerate(replicas):
            o = self.op(c.clock_mhz, c.share)
            demand = -(-(prompt + out) // c.block_tokens)
            t_avail, first, tbt = self._estimate(o, c, now, demand, prompt, residual)
            avail.append((t_avail, pos, c))
            if t_avail < _INF and feasible(first, tbt):
                e = o.e0[pe] + d_out * o.e1[pe]
                cands.append((e, c))
                e_min = min(e_min, e)
        if cands:
            self.decisions["energy"] += 1
            bound = e_min * (1.0 + self.tie) + _EPS
            best = None
            best_key = None
            for e, c in cands:
                if e <= bound:
                    key = (c.free_kv_blocks * c.block_tokens, c.share, -c.index)
                    if best_key is None or key > best_key:
                        best, best_key = c, key
            return best.index

        # Phase 3: fallback to the maximum clock, by earliest T_avail
        avail.sort(key=lambda a: (a[0], a[2].index))
        late: list[tuple[float, float, int, CandidateView]] = []
        for t_cur, pos, c in avail:
            o = self.op(self.max_clock_mhz, c.share)
            demand = -(-(prompt + out) // c.block_tokens)
            t_avail, first, tbt = self._estimate(o, c, now, demand, prompt, residual)
            if t_avail < _INF and feasible(first, tbt):
                self.decisions["fallback_max_clock"] += 1
                self.boost_requests[c.gpu] = now
                return c.index
            late.append((t_cur, first, pos, c))
        self.decisions["infeasible"] += 1
        self.scale_out_requests += 1
        self._pending_scale_out += 1
        self.last_scale_out_t = now
        if self.scale_out is not None:
            self.scale_out(now, req)
        return min(late, key=lambda a: (a[0], a[1], a[3].index))[3].index
