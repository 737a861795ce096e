"""Festina's local scheduler compiled (numba): the score, the batch fill, the frequency sweep, the step cut and the
GPU's clock vote of `commitenv_controllers.festina.local` (whose docstring states the algorithm), on arrays, so that
the engine's compiled loop plans each step without a call back to Python (`commitenv.sim.local_compiled`).
`FestinaLocal.plan` calls the same functions, so the reference engine and the loop plan the same steps.

Arrays (built by `FestinaLocal`):

* ``pf`` (parameters): row 0 `P_*` (beta, vote window, Table 2's SLOs, the SLO class edges); rows ``1 + m`` and
  ``1 + M + m`` model m's LUT grid clocks and shares (ascending, padded with +inf); then one row of step-law
  coefficients (`C_*`) per (model, grid clock, grid share), at ``1 + 2 M + (m NC + c) NS + s``.
* ``pi``: row m (model m's grid clock and share counts), row M (NC, NS: the padded counts).
* ``sf`` (state): per replica `S_*` (its latest decision and its usage since the last reset); then G rows of vote
  times and G rows of voted clocks (MHz), one column per replica (-inf: no vote).
* ``si`` (state): per replica `J_*` (its latest decision and the slots of its predicted batch); row R the counters
  (`K_CALLS`, `K_CAPPED`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from commitenv.sim.local_compiled import OUT_HEADER

EPS = 1e-12  # slack on the time comparisons
# pf row 0
P_BETA, P_WINDOW, P_TTFT, P_TBT, P_IN, P_OUT = 0, 1, 2, 5, 8, 10
N_P = 12
# step-law coefficients of a pf row
C_TAU0, C_TAU1, C_TAU2, C_TAU3, C_TAU4, C_A, C_C1, C_C2, C_B, C_KAPPA = range(10)
N_C = 10
# per-replica rows of sf: the latest decision (time, energy J, step s, needed share or NaN), usage (busy s, sum of
# clock x s, sum of share x s), the largest needed share since the last reset (0: none)
S_T, S_ENERGY, S_STEP, S_NEED, S_BUSY, S_FSUM, S_SSUM, S_PEAK = range(8)
N_S = 8
# per-replica rows of si: a decision recorded, its GPU, clock and GPU clock (MHz, -1: none), feasible, batch length,
# then the batch's slots
J_HAS, J_GPU, J_CLOCK, J_GPU_CLOCK, J_FEASIBLE, J_BATCH_N = range(6)
N_J = 6
K_CALLS, K_CAPPED = 0, 1


@njit(cache=True)
def _slo_class(p, o, pf):
    """`latency_slo.slo_class` of a prompt of ``p`` tokens and an output of ``o``."""
    ci = 0 if p < pf[0, P_IN] else (1 if p < pf[0, P_IN + 1] else 2)
    co = 0 if o < pf[0, P_OUT] else (1 if o < pf[0, P_OUT + 1] else 2)
    return max(co, ci)


@njit(cache=True)
def coeff_row(model, clock_mhz, share, pf, pi):
    """The ``pf`` row of model ``model``'s coefficients at (clock, share), each snapped down to its LUT grid (the
    lowest grid value when below it)."""
    m_count = pi.shape[0] - 1
    nc, ns = pi[model, 0], pi[model, 1]
    c = 0
    for j in range(nc):
        if pf[1 + model, j] <= clock_mhz + 1e-9:
            c = j
    s = 0
    for j in range(ns):
        if pf[1 + m_count + model, j] <= share + 1e-6:
            s = j
    return 1 + 2 * m_count + (model * pi[m_count, 0] + c) * pi[m_count, 1] + s


@njit(cache=True)
def step_time(k, P, n, L, A):
    """The step law's time under the coefficients ``k`` (a ``pf`` row)."""
    return k[C_TAU0] + k[C_TAU1] * P + k[C_TAU2] * n + k[C_TAU3] * L + k[C_TAU4] * A


@njit(cache=True)
def step_energy(k, P, n, L, A):
    """The step law's energy under the coefficients ``k``."""
    return k[C_A] + k[C_C1] * P + k[C_C2] * A + k[C_B] * n + k[C_KAPPA] * L


@njit(cache=True)
def scores(t, model, clock_mhz, share, budget, ints, flts, pf, pi):
    """Per task (the rows of ``ints``, ``flts``): latency, deadline, slack, age, the sort key of its score (-score;
    -inf: most urgent) and whether it is *not* mis-predicted (the first sort key)."""
    k = pf[coeff_row(model, clock_mhz, share, pf, pi)]
    tau0, tau1, tau4 = k[C_TAU0], k[C_TAU1], k[C_TAU4]
    dec0, tau3 = k[C_TAU0] + k[C_TAU2], k[C_TAU3]
    beta = pf[0, P_BETA]
    n = ints.shape[0]
    lat = np.empty(n)
    deadline = np.empty(n)
    slack = np.empty(n)
    age = np.empty(n)
    key = np.empty(n)
    fine = np.empty(n, np.int64)
    for i in range(n):
        decode, left, h, p, g, o = ints[i, 3], ints[i, 4], ints[i, 5], ints[i, 6], ints[i, 7], ints[i, 8]
        arrival, visible, last = flts[i, 0], flts[i, 1], flts[i, 2]
        cls = _slo_class(p, o, pf)
        if decode:
            lat[i] = dec0 + tau3 * (h + 1)
        else:
            lat[i] = (-(-left // budget)) * tau0 + tau1 * left + tau4 * (
                (h + left) * (h + left + 1) // 2 - h * (h + 1) // 2)
        if g == 0:
            deadline[i] = arrival + pf[0, P_TTFT + cls]
        else:
            per = (visible - t) / max(1, o - g)
            deadline[i] = min(last + pf[0, P_TBT + cls], t + per)
        slack[i] = deadline[i] - t - lat[i]
        age[i] = t - arrival
        den = slack[i] - beta * age[i]
        key[i] = -lat[i] / den if den > 0 else -math.inf
        fine[i] = g < 1 or g < o
    return lat, deadline, slack, age, key, fine


@njit(cache=True)
def priority(t, model, clock_mhz, share, budget, ints, flts, pf, pi):
    """The rows by priority: mis-predicted first, then descending score, earliest deadline, slot (stable sorts from
    the last key to the first: the tuple order, slots being unique)."""
    _, deadline, _, _, key, fine = scores(t, model, clock_mhz, share, budget, ints, flts, pf, pi)
    idx = np.argsort(ints[:, 1], kind="mergesort")
    idx = idx[np.argsort(deadline[idx], kind="mergesort")]
    idx = idx[np.argsort(key[idx], kind="mergesort")]
    return idx[np.argsort(fine[idx], kind="mergesort")]


@njit(cache=True)
def fill(t, order, budget, free, bs, cap, ints, flts, pf, rows, pre):
    """The step the engine fills from the rows ``order`` (`Replica.schedule_ordered` replayed): writes the batch's rows
    and their tokens into ``rows`` (two columns) and, per prefill chunk, (deadline, tokens left after it, history)
    into ``pre``; returns (batch
    length, prefill chunks, P, A, n, L, least time to a decode's next-token deadline, least visible-deadline budget
    per predicted token of its decodes)."""
    running = 0
    for i in range(ints.shape[0]):
        running += ints[i, 2]
    run_left = running
    nb = npre = 0
    P = A = n = L = 0
    dec_tbt = dec_budget = math.inf
    for i in order:
        if budget <= 0 or (run_left == 0 and running >= cap):
            break  # nothing more fits: no budget left, or only waiting tasks left and the sequence cap reached
        run, decode, left, h, p, g, o, blocks = (ints[i, 2], ints[i, 3], ints[i, 4], ints[i, 5], ints[i, 6], ints[i, 7],
                                                 ints[i, 8], ints[i, 9])
        arrival, visible, last = flts[i, 0], flts[i, 1], flts[i, 2]
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
        rows[nb, 0] = i
        rows[nb, 1] = kk
        nb += 1
        cls = _slo_class(p, o, pf)
        rem = max(1, o - g)
        if decode:
            n += 1
            L += h + 1
            dec_budget = min(dec_budget, (visible - t) / rem)
            dec_tbt = min(dec_tbt, last + pf[0, P_TBT + cls] - t)
        else:
            P += kk
            A += kk * h + kk * (kk + 1) // 2
            if g == 0:
                deadline = arrival + pf[0, P_TTFT + cls]
            else:
                deadline = min(last + pf[0, P_TBT + cls], t + (visible - t) / rem)
            pre[npre, 0] = deadline
            pre[npre, 1] = left - kk
            pre[npre, 2] = h + kk
            npre += 1
    return nb, npre, P, A, n, L, dec_tbt, dec_budget


@njit(cache=True)
def feasible(k, P, A, n, L, dec_tbt, dec_budget, pre, npre, t, budget):
    """Whether every task of a batch meets its deadline under the coefficients ``k``, and the step time."""
    ts = step_time(k, P, n, L, A)
    if ts > dec_tbt + EPS or ts > dec_budget + EPS:
        return False, ts
    if npre:
        ride = k[C_TAU0] + k[C_TAU2] * n + k[C_TAU3] * L
        chunk = max(budget - n, 1)
        for j in range(npre):
            r, h = int(pre[j, 1]), int(pre[j, 2])
            later = 0.0
            if r > 0:
                later = (-(-r // chunk)) * ride + k[C_TAU1] * r + k[C_TAU4] * (
                    (h + r) * (h + r + 1) // 2 - h * (h + 1) // 2)
            if t + ts + later > pre[j, 0] + EPS:
                return False, ts
    return True, ts


@njit(cache=True)
def plan_core(t, x, gpu, model, clock_level, levels, share, free, bs, budget, max_seqs, ints, flts, pf, pi, sf, si,
              out):
    """`FestinaLocal.plan` on arrays, with `commitenv.sim.local_compiled`'s arguments and result."""
    n_rep = si.shape[0] - 1
    n_gpu = (sf.shape[0] - n_rep) // 2
    if x >= n_rep or gpu >= n_gpu:
        raise ValueError("festina local: state arrays too small for this replica or GPU")
    si[n_rep, K_CALLS] += 1
    out[0] = -1
    out[1] = 0
    N = ints.shape[0]
    if N == 0:
        return 0
    clock_mhz = levels[clock_level]
    order = priority(t, model, clock_mhz, share, budget, ints, flts, pf, pi)
    rows = np.empty((N, 2), np.int64)
    pre = np.empty((N, 3))
    nb, npre, P, A, n, L, dec_tbt, dec_budget = fill(t, order, budget, free, bs, max_seqs, ints, flts, pf, rows, pre)
    if nb == 0:
        si[x, J_HAS], si[x, J_GPU], si[x, J_CLOCK], si[x, J_GPU_CLOCK], si[x, J_FEASIBLE], si[x, J_BATCH_N] = (
            1, gpu, -1, -1, 0, 0)
        sf[x, S_T], sf[x, S_ENERGY], sf[x, S_STEP], sf[x, S_NEED] = t, np.nan, np.nan, np.nan
        for i in range(N):
            out[OUT_HEADER + i] = order[i]
        return N
    # the sweep: the lowest-energy clock of the GPU's levels on the LUT grid meeting the deadlines (ties: the lower)
    m_count = pi.shape[0] - 1
    nc, ns = pi[model, 0], pi[model, 1]
    lv = np.sort(levels)
    best_c = -1
    best_e = best_t = 0.0
    top_c = -1
    for c in lv:
        on = False
        for j in range(nc):
            if pf[1 + model, j] == c:
                on = True
        if not on:
            continue
        top_c = c
        k = pf[coeff_row(model, c, share, pf, pi)]
        ok, ts = feasible(k, P, A, n, L, dec_tbt, dec_budget, pre, npre, t, budget)
        if ok:
            e = step_energy(k, P, n, L, A)
            if best_c < 0 or e < best_e - EPS:
                best_c, best_e, best_t = c, e, ts
    if top_c < 0:
        raise ValueError("festina local: none of the GPU's clocks is on the LUT grid")
    need = np.nan
    if best_c < 0:
        k = pf[coeff_row(model, top_c, share, pf, pi)]
        clock, ok, energy, step_s = top_c, False, step_energy(k, P, n, L, A), step_time(k, P, n, L, A)
    else:
        clock, ok, energy, step_s = best_c, True, best_e, best_t
        for j in range(ns):  # the least grid share meeting the deadlines at that clock
            s = pf[1 + m_count + model, j]
            if feasible(pf[coeff_row(model, clock, s, pf, pi)], P, A, n, L, dec_tbt, dec_budget, pre, npre, t,
                        budget)[0]:
                need = s
                break
    # the GPU's clock: the highest recent choice of its replicas
    vt, vc = sf[n_rep + gpu], sf[n_rep + n_gpu + gpu]
    vt[x] = t
    vc[x] = clock
    lo = t - pf[0, P_WINDOW]
    gpu_clock = clock
    for r in range(vt.shape[0]):
        if vt[r] >= lo and vc[r] > gpu_clock:
            gpu_clock = vc[r]
    # the step cut: decodes first, the largest token budget that keeps their next-token deadlines at the clock the
    # step runs at
    plan_budget = 0
    kc = pf[coeff_row(model, clock_mhz, share, pf, pi)]
    if n and P and step_time(kc, P, n, L, A) > min(dec_tbt, dec_budget) + EPS:
        cut = np.empty(N, np.int64)
        j = 0
        for i in order:
            if ints[i, 3]:
                cut[j] = i
                j += 1
        for i in order:
            if not ints[i, 3]:
                cut[j] = i
                j += 1
        _, _, _, _, an, aL, a_tbt, a_budget = fill(t, cut, budget, free, bs, max_seqs, ints, flts, pf, rows, pre)
        lo_b = max(an, 1)
        room = min(a_tbt, a_budget) - (kc[C_TAU0] + kc[C_TAU2] * an + kc[C_TAU3] * aL)
        p_max = P if kc[C_TAU1] <= 0 else min(P, max(int(room / kc[C_TAU1]) + 1, 0))
        hi_b = max(min(budget, lo_b + p_max), lo_b)
        while lo_b < hi_b:
            mid = (lo_b + hi_b + 1) // 2
            _, _, bP, bA, bn, bL, b_tbt, b_budget = fill(t, cut, mid, free, bs, max_seqs, ints, flts, pf, rows, pre)
            if step_time(kc, bP, bn, bL, bA) <= min(b_tbt, b_budget) + EPS:
                lo_b = mid
            else:
                hi_b = mid - 1
        nb, npre, P, A, n, L, dec_tbt, dec_budget = fill(t, cut, lo_b, free, bs, max_seqs, ints, flts, pf, rows, pre)
        order = cut
        plan_budget = lo_b
        energy = step_energy(kc, P, n, L, A)
        step_s = step_time(kc, P, n, L, A)
        si[n_rep, K_CAPPED] += 1
    if nb > si.shape[1] - N_J:
        raise ValueError("festina local: a batch longer than the state arrays' sequence cap")
    si[x, J_HAS], si[x, J_GPU], si[x, J_CLOCK], si[x, J_GPU_CLOCK], si[x, J_FEASIBLE], si[x, J_BATCH_N] = (
        1, gpu, clock, gpu_clock, ok, nb)
    for j in range(nb):
        si[x, N_J + j] = ints[rows[j, 0], 1]
    sf[x, S_T], sf[x, S_ENERGY], sf[x, S_STEP], sf[x, S_NEED] = t, energy, step_s, need
    peak = 1.0 if math.isnan(need) else need
    if peak > sf[x, S_PEAK]:
        sf[x, S_PEAK] = peak
    sf[x, S_BUSY] += step_s
    sf[x, S_FSUM] += clock * step_s
    sf[x, S_SSUM] += peak * step_s
    level = -1
    for j in range(levels.shape[0]):
        if levels[j] == gpu_clock:
            level = j
            break
    out[0] = level
    out[1] = plan_budget
    for i in range(N):
        out[OUT_HEADER + i] = order[i]
    return N


def festina_plan(t, x, gpu, model, clock_level, levels, share, free, bs, budget, max_seqs, ints, flts, pf, pi, sf, si,
                 out):  # pragma: no cover (compiled: `commitenv.sim.local_compiled.compile_plan`)
    """`plan_core` as the compiled loop calls it (`commitenv.sim.local_compiled.PLAN_SIG`)."""
    return plan_core(t, x, gpu, model, clock_level, levels, share, free, bs, budget, max_seqs, ints, flts, pf, pi, sf,
                     si, out)
