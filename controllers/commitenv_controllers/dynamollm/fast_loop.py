"""DynamoLLM's fast loop: estimate the queued work of each replica from the snapshot and choose the clock that
clears it within the SLO at the least energy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from commitenv_controllers.dynamollm.capacity import ClockLaws


@dataclass(frozen=True)
class QueueEstimate:
    """Predicted completion of every live request at every clock level (from a snapshot)."""

    t: float
    slots: np.ndarray  # (R,)
    deadline: np.ndarray  # (R,)
    finish: np.ndarray  # (R, F) absolute predicted finish times
    busy_s: np.ndarray  # (F,) replica-seconds to finish the queued work
    energy_j: np.ndarray  # (F,) step energy of that work
    waiting: int  # requests not yet admitted (waiting queues and unrouted)

    def misses(self, clock: int, *, include_overdue: bool = False) -> int:
        live = np.ones(len(self.slots), bool) if include_overdue else self.deadline > self.t
        return int(np.count_nonzero(live & (self.finish[:, clock] > self.deadline)))

    def admissible(self) -> np.ndarray:
        """(F,) bool: every request not already past its deadline finishes in time at that clock."""
        live = self.deadline > self.t
        if not live.any():
            return np.ones(self.finish.shape[1], bool)
        return np.all(self.finish[live] <= self.deadline[live, None], axis=0)


def _replica_estimate(prompt: np.ndarray, gen: np.ndarray, comp: np.ndarray, out: np.ndarray, laws: ClockLaws,
                      t: float):
    """Finish times (m, F), busy time (F,) and energy (F,) of one replica's queue, in FCFS order (float arrays of
    its requests' prompt, generated, computed and predicted output tokens).

    Prefills run in queue order; a prefill step also carries the decodes of the requests ahead of it that are
    still decoding then (they take budget tokens, so the chunk is smaller, and add tau2 + tau3 * context).
    Request i's decode steps are shared with the other batch members for as long as they still decode
    (effective batch 1 + sum_j min(d_j, d_i) / d_i), and carry chunks of the prefills still pending behind it
    (at most one budget-sized chunk per step). Requests beyond ``max_seqs`` are treated like the others.
    """
    m = len(prompt)
    p_rem = np.maximum(prompt + gen - comp - (gen > 0), 0.0)
    pending = p_rem > 0
    d = np.maximum(out - gen - pending, 0.0)  # remaining decode steps (the last prefill chunk emits a token)
    base = prompt + gen + pending - 1.0  # context before the first remaining decode step (step s attends base + s)
    A = p_rem * comp + p_rem * (p_rem + 1) / 2
    pf_t = np.outer(p_rem, laws.tau1) + np.outer(A, laws.tau4)  # (m, F) prefill compute time
    pf_e = np.outer(p_rem, laws.c1) + np.outer(A, laws.c2)
    in_batch = np.arange(m) < laws.max_seqs
    # step index at which each prefill starts / ends (whole-budget chunks as a first guess)
    chunks0 = np.ceil(p_rem / laws.budget)
    s_end = np.cumsum(chunks0)
    s_start = s_end - chunks0
    dec_start = np.where(pending, s_end, 0.0)  # step from which request j decodes
    # j (ahead of i, in the batch) still decodes while i's prefill starts: d_j > s_start_i - dec_start_j >= 0
    lag = s_start[:, None] - dec_start[None, :]  # (i, j)
    ahead = np.tril(np.ones((m, m), bool), k=-1) & in_batch[None, :]
    alive = ahead & (lag >= 0) & (d[None, :] > lag)
    n_i = alive.sum(axis=1).astype(np.float64)
    L_i = np.where(alive, base[None, :] + 1.0 + lag, 0.0).sum(axis=1)
    chunks = np.where(pending, np.ceil(p_rem / np.maximum(laws.budget - n_i, 1.0)), 0.0)
    step_over = laws.tau0[None, :] + np.outer(n_i, laws.tau2) + np.outer(L_i, laws.tau3)  # (m, F)
    pcum = np.cumsum(chunks[:, None] * step_over + pf_t, axis=0)
    start = np.where(pending[:, None], pcum, 0.0)
    # decode: effective co-batch over request i's own decode steps
    bd = np.where(in_batch, d, 0.0)
    share = np.minimum(bd[None, :], d[:, None]) / np.maximum(d[:, None], 1.0)  # (i, j), 1 on the diagonal if d_i > 0
    b_eff = np.maximum(share.sum(axis=1), 1.0)
    l_eff = (share * base[None, :]).sum(axis=1)
    dec = (np.outer(d, laws.tau0) + np.outer(d * b_eff, laws.tau2) + np.outer(d * l_eff, laws.tau3)
           + np.outer(b_eff * d * (d + 1) / 2, laws.tau3))
    # prefill chunks still pending behind request i ride in its decode steps (one budget chunk per step at most)
    pf_pending = np.where(pending[:, None], pf_t, 0.0)
    total_pf = pf_pending.sum(axis=0)
    behind = total_pf[None, :] - np.cumsum(pf_pending, axis=0)  # prefill of pending requests after i
    riding = np.where(pending[:, None], behind, total_pf[None, :])  # a decoding request: every pending one
    extra = np.minimum(riding, d[:, None] * (laws.tau1 * laws.budget)[None, :])
    finish = t + start + dec + extra
    steps_dec = float(d.max()) if m else 0.0
    ctx = d * base + d * (d + 1) / 2
    busy = (chunks.sum() * laws.tau0 + pf_t.sum(axis=0) + laws.tau2 * d.sum() + laws.tau3 * ctx.sum()
            + laws.tau0 * steps_dec)
    energy = (chunks.sum() * laws.a + pf_e.sum(axis=0) + laws.b * d.sum() + laws.kappa * ctx.sum()
              + laws.a * steps_dec)
    return finish, busy, energy


def estimate_queue(snap: Any, laws: ClockLaws) -> QueueEstimate:
    """Per-request finish times at every clock for the live requests of a `Snapshot` (module docstring)."""
    t = float(snap.t)
    F = laws.n_clocks
    req = snap.requests
    n_rep = len(snap.replicas)
    queues = [np.flatnonzero(req.replica == i) for i in range(n_rep)]  # running, then waiting, in order
    unrouted = np.flatnonzero(req.replica < 0)
    if len(unrouted):  # nothing routable right now: they will land on the least-loaded replica
        i = min(range(n_rep), key=lambda j: (len(queues[j]), j))
        queues[i] = np.concatenate([queues[i], unrouted])
    cols = [np.asarray(a, dtype=np.float64) for a in
            (req.prompt_tokens, req.generated_tokens, req.computed_tokens, req.output_tokens)]
    order: list[np.ndarray] = []
    fins: list[np.ndarray] = []
    busy = np.zeros(F)
    energy = np.zeros(F)
    for q in queues:
        if not len(q):
            continue
        f, b, e = _replica_estimate(*(c[q] for c in cols), laws, t)
        fins.append(f)
        busy += b
        energy += e
        order.append(q)
    idx = np.concatenate(order) if order else np.zeros(0, dtype=np.int64)
    waiting = int(np.count_nonzero(~req.running))
    finish = np.vstack(fins) if fins else np.zeros((0, F))
    return QueueEstimate(t, np.asarray(req.slot[idx], dtype=np.int64), np.asarray(req.deadline_s[idx], dtype=np.float64),
                         finish, busy, energy, waiting)


def arrivals_work(table: Any, laws: ClockLaws, batch: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Replica-seconds and step energy (F,) to serve the requests of ``table`` (decode steps shared by
    ``batch`` requests)."""
    F = laws.n_clocks
    if table is None or len(table) == 0:
        return np.zeros(F), np.zeros(F)
    p = np.asarray(table.prompt_tokens, dtype=np.float64)
    o = np.asarray(table.output_tokens, dtype=np.float64)
    d = np.maximum(o - 1, 0)
    k = np.ceil(p / laws.budget).sum() + d.sum() / max(batch, 1.0)
    A = (p * (p + 1) / 2).sum()
    ctx = (d * p + d * (d + 1) / 2).sum()
    busy = k * laws.tau0 + laws.tau1 * p.sum() + laws.tau4 * A + laws.tau2 * d.sum() + laws.tau3 * ctx
    energy = k * laws.a + laws.c1 * p.sum() + laws.c2 * A + laws.b * d.sum() + laws.kappa * ctx
    return busy, energy


def choose_clock(est: QueueEstimate, laws: ClockLaws, active: int, interval_s: float, *,
                 fc_busy: np.ndarray | None = None, fc_energy: np.ndarray | None = None,
                 max_util: float = 0.85) -> tuple[int, np.ndarray, np.ndarray]:
    """The fast-loop rule: the least-energy clock at which every live request meets its deadline and the
    forecast work fits in ``max_util`` of the active replicas' time; the top clock when none qualifies.
    Returns (clock index, admissible mask (F,), estimated interval energy (F,))."""
    F = laws.n_clocks
    fc_busy = np.zeros(F) if fc_busy is None else fc_busy
    fc_energy = np.zeros(F) if fc_energy is None else fc_energy
    ok = est.admissible() & (fc_busy <= max_util * active * interval_s)
    work_t = est.busy_s + fc_busy
    e = est.energy_j + fc_energy + laws.idle_w * np.maximum(active * interval_s - work_t, 0.0)
    if not ok.any():
        return laws.top, ok, e
    cand = np.flatnonzero(ok)
    return int(cand[np.argmin(e[cand])]), ok, e


def transition_energy_j(n_from: int, n_to: int, laws: ClockLaws) -> float:
    """Energy of changing the active count: each replica switched on now, or switched off now (and so woken
    again later), draws active-idle power at the top clock for the activation latency without serving."""
    return abs(int(n_to) - int(n_from)) * laws.activation_s * float(laws.idle_w[laws.top])
