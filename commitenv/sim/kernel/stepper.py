"""One replica stepped a single engine step at a time on the compiled loop's own functions (`_start_segment`,
`_finish_segment`): the vLLM scheduler, KV blocks with preemption and the profile's step laws, with requests added
as they come. The fake serving engine (`commitenv.backends.fake_engine`) is this, on a virtual clock."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commitenv.profiles.schema import Profile
from commitenv.sim.kernel.heap import _waiting, _wpush_back
from commitenv.sim.kernel.layout import (G_CLOCK, I_DONE, I_LIVE, Q_ARRIVAL, Q_COMPUTED, Q_FINISH, Q_FIRST, Q_LAST,
                                         Q_GENERATED, Q_OUT, Q_PREEMPT, Q_PROMPT, Q_REPLICA, R_BATCH_N, R_RUN_N, R_T1,
                                         R_ENERGY, R_UNF, R_WLEN, S_CLOSED)
from commitenv.sim.kernel.segment import _decode_flags, _finish_segment, _start_segment

__all__ = ["ReplicaStepper", "StepStart"]


@dataclass(frozen=True)
class StepStart:
    """A step scheduled on the replica: its batch (request indices, new tokens each), the step laws' terms (prefill
    tokens, prefill attention pairs, decoding requests, summed decode context), its duration and energy by the law,
    and the requests its scheduling preempted."""

    requests: tuple[int, ...]
    new_tokens: tuple[int, ...]
    prefill_tokens: int
    prefill_pairs: int
    decodes: int
    decode_context: int
    duration_s: float
    energy_j: float
    preempted: tuple[int, ...]


class ReplicaStepper:
    """A lone replica of ``profile`` on its own GPU, every step started and finished by the caller (never a closed-form
    run). Requests are numbered in the order added."""

    def __init__(self, profile: Profile, clock_idx: int) -> None:
        from commitenv.sim.noise import NoiseSpec
        from commitenv.sim.pool import Pool
        from commitenv.sim.records import EngineOptions, PoolLayout

        opts = EngineOptions(noise=NoiseSpec(0.0, 0.0), closed_form=False)  # (the law's step: the caller adds noise)
        pool = Pool(profile, PoolLayout.single(1), opts,
                    clock_mhz=profile.clocks[clock_idx].mhz)
        self._ks = ks = pool._ks
        ks.sched = ks.sched.copy()
        ks.sched[S_CLOSED] = 0
        self.n = 0  # requests added

    def add(self, prompt_tokens: int, max_tokens: int, t: float) -> int:
        """Queue a request arriving at ``t`` (the end of the replica's waiting queue); its index."""
        ks = self._ks
        i = self.n
        if i >= ks.qi.shape[0]:
            self._grow()
        ks.qi[i] = 0
        ks.qi[i, Q_PROMPT], ks.qi[i, Q_OUT], ks.qi[i, Q_REPLICA] = prompt_tokens, max_tokens, 0
        ks.qf[i] = 0.0
        ks.qf[i, Q_ARRIVAL], ks.qf[i, Q_FIRST], ks.qf[i, Q_FINISH], ks.qf[i, Q_LAST] = t, -1.0, np.nan, -1.0
        _wpush_back(ks.ri, ks.wq, 0, i)
        ks.ri[0, R_UNF] += 1
        ks.si[I_LIVE] += 1
        self.n = i + 1
        return i

    def _grow(self) -> None:
        ks = self._ks
        for name in ("qi", "qf", "qc", "rejected", "wq", "done_out", "plan", "on_run"):
            a = getattr(ks, name)
            setattr(ks, name, np.concatenate([a, np.zeros_like(a)]))

    def has_work(self) -> bool:
        ri = self._ks.ri
        return bool(ri[0, R_RUN_N] or ri[0, R_WLEN])

    def computed(self, i: int) -> int:
        return int(self._ks.qi[i, Q_COMPUTED])

    def generated(self, i: int) -> int:
        return int(self._ks.qi[i, Q_GENERATED])

    def start(self, t: float, clock_idx: int) -> StepStart | None:
        """Schedule and start the next step at ``t`` with the GPU at clock level ``clock_idx`` (None: nothing can
        be scheduled)."""
        ks = self._ks
        ks.gi[0, G_CLOCK] = clock_idx
        running = ks.run[0, : ks.ri[0, R_RUN_N]].copy()  # (only a running request can be preempted)
        before = ks.qi[running, Q_PREEMPT].copy()
        if not _start_segment(t, 0, ks.ri, ks.rf, ks.qi, ks.wq, ks.run, ks.bq, ks.bk, ks.coc, ks.gi, ks.gf, ks.ftab,
                              ks.fetab, ks.cell, ks.sched, ks.si, ks.plan, ks.on_run, ks.pfx):
            return None
        nb = int(ks.ri[0, R_BATCH_N])
        reqs, new = ks.bq[0, :nb], ks.bk[0, :nb]
        qi = ks.qi
        dec = _decode_flags(qi, reqs, new)  # (the step laws' terms, as `_start_segment` forms them)
        comp, k = qi[reqs, Q_COMPUTED][~dec], new[~dec]
        P, A = int(k.sum()), int((k * comp + k * (k + 1) // 2).sum())
        n, L = int(dec.sum()), int((qi[reqs, Q_COMPUTED][dec] + 1).sum())
        bumped = set(running[qi[running, Q_PREEMPT] > before].tolist())
        pre = tuple(r for r in self._waiting().tolist() if r in bumped) if bumped else ()  # (in waiting order)
        return StepStart(tuple(reqs.tolist()), tuple(new.tolist()), P, A, n, L, float(ks.rf[0, R_T1]) - t, float(ks.rf[0, R_ENERGY]),
                         pre)

    def finish(self, t1: float) -> list[int]:
        """Finish the step in flight at ``t1``: its progress applied, its finished requests (indices) out of the
        replica, in the order the engine completes them."""
        ks = self._ks
        ks.rf[0, R_T1] = t1
        d0 = int(ks.si[I_DONE])
        _finish_segment(t1, 0, ks.ri, ks.rf, ks.qi, ks.qf, ks.qc, ks.run, ks.bq, ks.bk, ks.e_dyn, ks.sched, ks.done_out,
                        ks.si, ks.lgi, ks.lgf, ks.lgm, ks.pfx)
        return ks.done_out[d0: int(ks.si[I_DONE])].tolist()

    def _waiting(self) -> np.ndarray:
        return _waiting(self._ks.ri, self._ks.wq, 0)
