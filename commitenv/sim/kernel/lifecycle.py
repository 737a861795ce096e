"""Instances leaving and joining GPUs on the compiled loop (`commitenv.sim.placement`): the idle floor their
lifecycle states set, the migration of a moving instance's requests, taking it off its GPU, and its cold start where
it goes (memory first, then SMs)."""

from __future__ import annotations

from numba import njit

from commitenv.sim.kernel.cached import kv_release, kv_reset
from commitenv.sim.kernel.heap import _cdiv, _push, _wpush_back
from commitenv.sim.kernel.layout import (C_TAU0, C_TAU1, C_TAU2, C_TAU3, C_TAU4, F_MIG_BYTES, F_MIG_GBS, F_MIG_J,
                                         F_MIG_JPG, F_MIG_SETUP, GF_E_FLOOR, GF_FLOOR_W, GF_POWER, GF_T_FLOOR, G_CLOCK,
                                         G_NHOST, I_COLD, I_MIGRATED, I_NMIG, MIG_LATENCY, Q_COMPUTED, Q_GENERATED,
                                         Q_NH, Q_OUT, Q_PROMPT, Q_REPLICA, Q_STARTED, R_BUDGET, R_CAP, R_DEST,
                                         R_FLOOR_ACC, R_FLOOR_T, R_FLOOR_W, R_FREE, R_GPU, R_KVB, R_LOAD_S, R_LOAD_T,
                                         R_LOAD_W, R_LREADY, R_LWAIT, R_MEM, R_MIGRATE, R_RUN_N, R_SEG, R_STATE, R_T0,
                                         R_T1, R_UNF, R_VER, R_WHEAD, R_WLEN)
from commitenv.sim.states import (ACTIVE, DRAINING, EV_LAND, EV_LOAD, LOADING, MOVING, SEG_NONE, WAKING)


@njit(cache=True)
def _set_floor(t, g, power_w, ri, rf, gi, gf, gh):
    """`GPU.set_floor`: close GPU ``g``'s floor meter at ``t``; its instances' segments in flight are charged the new
    floor from ``t`` on."""
    gf[g, GF_E_FLOOR] += gf[g, GF_FLOOR_W] * (t - gf[g, GF_T_FLOOR])
    gf[g, GF_T_FLOOR] = t
    if power_w != gf[g, GF_FLOOR_W]:
        for j in range(gi[g, G_NHOST]):
            x = gh[g, j]
            if ri[x, R_SEG] != SEG_NONE and rf[x, R_T0] <= t < rf[x, R_T1]:
                rf[x, R_FLOOR_ACC] += rf[x, R_FLOOR_W] * (t - rf[x, R_FLOOR_T])
                rf[x, R_FLOOR_T] = t
                rf[x, R_FLOOR_W] = power_w
    gf[g, GF_FLOOR_W] = power_w


@njit(cache=True)
def _floor_power(g, ri, rf, gi, gf, gh, floor_tab):
    """`GPU.floor_power`: the most awake of its instances' lifecycle states sets it (active or waking, or loaded and
    waiting for SMs; then draining or moving; else standby), at the GPU's clock; an instance loading its weights draws
    at least its ``load_w``, one waiting for memory nothing."""
    col = 2
    loading = False
    load_w = 0.0
    for j in range(gi[g, G_NHOST]):
        x = gh[g, j]
        st = ri[x, R_STATE]
        if st == LOADING:
            if ri[x, R_LWAIT]:
                continue
            if not ri[x, R_LREADY]:
                if not loading or rf[x, R_LOAD_W] > load_w:
                    load_w = rf[x, R_LOAD_W]
                loading = True
                continue
            st = WAKING
        c = 0 if st == ACTIVE or st == WAKING else (1 if st == DRAINING or st == MOVING else 2)
        if c < col:
            col = c
    if loading:
        w = floor_tab[g, gi[g, G_CLOCK], 3 + col]
        return (load_w if load_w > w else w) * gf[g, GF_POWER]
    return floor_tab[g, gi[g, G_CLOCK], col]


@njit(cache=True)
def _floor_changed(t, g, ri, rf, gi, gf, gh, floor_tab):
    """`ReferencePool._floor_changed`: re-evaluate GPU ``g``'s floor power at ``t`` after a lifecycle change."""
    p = _floor_power(g, ri, rf, gi, gf, gh, floor_tab)
    if p != gf[g, GF_FLOOR_W]:
        _set_floor(t, g, p, ri, rf, gi, gf, gh)


@njit(cache=True)
def _start_load(t, rep, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv):
    """`Placement._start_load`: begin ``rep``'s cold start if its memory share fits beside what the instances on its
    GPU hold (those still waiting for memory hold none)."""
    g = ri[rep, R_GPU]
    held = 0.0
    for j in range(gi[g, G_NHOST]):
        x = gh[g, j]
        if x != rep and not (ri[x, R_STATE] == LOADING and ri[x, R_LWAIT]):
            held += rf[x, R_MEM]
    if held + rf[rep, R_MEM] > 1.0 + 1e-9:
        return
    ri[rep, R_LWAIT] = 0
    rf[rep, R_LOAD_T] = t + rf[rep, R_LOAD_S]
    si[I_COLD] += 1
    _floor_changed(t, g, ri, rf, gi, gf, gh, floor_tab)
    _push(si, ht, hk, hs, hi, hv, rf[rep, R_LOAD_T], EV_LOAD, rep, ri[rep, R_VER])


@njit(cache=True)
def _detach(t, rep, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv, pfx):
    """`Placement._detach`: take ``rep`` (idle) off its GPU and cold-start it on its destination with a fresh KV
    cache; instances on the GPU it left waiting for its memory begin their loads, and loaded ones waiting for its SMs
    check again at ``t`` (a load event each)."""
    src, dest = ri[rep, R_GPU], ri[rep, R_DEST]
    ri[rep, R_DEST] = -1
    if ri[rep, R_STATE] == MOVING:
        si[I_NMIG] -= 1
    n = gi[src, G_NHOST]
    k = 0
    for j in range(n):  # (off the source's list, the others in order)
        if gh[src, j] != rep:
            gh[src, k] = gh[src, j]
            k += 1
    gh[src, k] = -1
    gi[src, G_NHOST] = k
    ri[rep, R_GPU] = dest  # `_begin_load`
    gh[dest, gi[dest, G_NHOST]] = rep
    gi[dest, G_NHOST] += 1
    ri[rep, R_FREE] = ri[rep, R_CAP]
    kv_reset(rep, ri[rep, R_CAP], pfx)
    ri[rep, R_STATE] = LOADING
    ri[rep, R_LREADY] = 0
    ri[rep, R_LWAIT] = 1
    ri[rep, R_VER] += 1
    _start_load(t, rep, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv)
    _floor_changed(t, src, ri, rf, gi, gf, gh, floor_tab)
    left = gh[src, :k].copy()
    for x in left:
        if ri[x, R_STATE] == LOADING and ri[x, R_LWAIT]:
            _start_load(t, x, ri, rf, gi, gf, gh, floor_tab, si, ht, hk, hs, hi, hv)
    for j in range(gi[src, G_NHOST]):
        x = gh[src, j]
        if ri[x, R_STATE] == LOADING and ri[x, R_LREADY]:
            _push(si, ht, hk, hs, hi, hv, t, EV_LOAD, x, ri[x, R_VER])


@njit(cache=True)
def _migrate_out(t, rep, ri, rf, qi, wq, run, coc, gi, sf, si, e_dyn, ht, hk, hs, hi, hv, tvi, live_slots, pred_out, pfx):
    """`Placement._migrate_out`: ``rep``'s running requests its migration mode moves (all, or with ``latency_aware``
    those whose predicted remaining time exceeds the transfer time) and its started waiting ones leave with their KV
    for the link, each landing (an `EV_LAND` event) after its transfer to be routed anew; the link's energy is booked
    on its GPU."""
    setup, gbs, jpg = sf[F_MIG_SETUP], sf[F_MIG_GBS], sf[F_MIG_JPG]
    kvb = rf[rep, R_KVB]
    g = ri[rep, R_GPU]
    nr = ri[rep, R_RUN_N]
    lat = ri[rep, R_MIGRATE] == MIG_LATENCY
    step_s = 0.0
    if lat and nr:
        ctx = 0
        for i in range(nr):
            ctx += qi[run[rep, i], Q_COMPUTED] + 1
        co = coc[rep, gi[g, G_CLOCK]]
        step_s = co[C_TAU0] + co[C_TAU1] * 0 + co[C_TAU2] * nr + co[C_TAU3] * ctx + co[C_TAU4] * 0
    n_live, slot0, seen_pool = tvi[0], tvi[1], tvi[3] != 0
    moved = run[rep, :nr].copy()
    nm = 0
    keep = 0
    for i in range(nr):
        r = run[rep, i]
        if lat:
            if seen_pool:
                pred = pred_out[live_slots[r] if r < n_live else slot0 + r - n_live]
            else:
                pred = qi[r, Q_OUT]
            prompt = qi[r, Q_PROMPT]
            done = qi[r, Q_COMPUTED] if qi[r, Q_COMPUTED] < prompt else prompt
            left = max(pred - qi[r, Q_GENERATED], 1) + _cdiv(prompt - done, ri[rep, R_BUDGET])
            if not left * step_s > setup + qi[r, Q_COMPUTED] * kvb / (gbs * 1e9):
                run[rep, keep] = r
                keep += 1
                continue
        moved[nm] = r
        nm += 1
    ri[rep, R_RUN_N] = keep
    n = ri[rep, R_WLEN]
    r = ri[rep, R_WHEAD]
    ri[rep, R_WLEN] = 0
    started = []
    for _ in range(n):
        nxt = wq[r]
        if qi[r, Q_STARTED]:
            started.append(r)
        else:
            _wpush_back(ri, wq, rep, r)
        r = nxt
    for j in range(nm + len(started)):
        r = moved[j] if j < nm else started[j - nm]
        nbytes = qi[r, Q_COMPUTED] * kvb
        kv_release(rep, r, ri, qi, pfx)
        qi[r, Q_NH] = 0  # (its KV arrives as private blocks)
        qi[r, Q_REPLICA] = -1
        if nbytes:
            e = nbytes / 1e9 * jpg
            e_dyn[g] += e - 0.0
            sf[F_MIG_J] += e
            sf[F_MIG_BYTES] += nbytes
        si[I_MIGRATED] += 1
        land = t + (setup + nbytes / (gbs * 1e9) if nbytes else 0.0)
        _push(si, ht, hk, hs, hi, hv, land, EV_LAND, r, 0)
    ri[rep, R_UNF] = ri[rep, R_RUN_N] + ri[rep, R_WLEN]
