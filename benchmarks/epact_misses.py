"""Where do ePACT's deadline misses come from? Run a day with an instrumented ePACT (or a baseline) and save
per-request facts, then break the misses down.

    PYTHONPATH=. python benchmarks/epact_misses.py run epact-h20-day --controller epact --out /tmp/m/epact.npz
    PYTHONPATH=. python benchmarks/epact_misses.py run epact-h20-day --controller vllm --out /tmp/m/vllm.npz
    PYTHONPATH=. python benchmarks/epact_misses.py report /tmp/m/epact.npz --baseline /tmp/m/vllm.npz
    PYTHONPATH=. python benchmarks/epact_misses.py counterfactual /tmp/m/epact.npz --band 0 0.03 --margin-idx 0 2

``run`` stores, per request: arrival, deadline, finish, L_ref, true and predicted output length, and for
ePACT the decisions whose snapshot captured it (how many; the predicted finish under the chosen
configuration at the first and the last of them). Per decision: time, chosen configuration, captured count,
predicted misses (captured / forecast) of the chosen configuration, whether it was admitted; and every
evaluated candidate with its predicted misses also under relative latency margins (`MARGINS`), which
``counterfactual`` uses to re-select each decision under another rule (energy band, latency margin).
Extra ePACT keyword arguments: ``--kw name=value`` (repeatable; values parsed as Python literals).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import time
from pathlib import Path

import numpy as np


MARGINS = (0.0, 0.03, 0.05, 0.1, 0.15, 0.2)  # relative latency margins recorded per candidate (evals columns 11+)


def _run(args: argparse.Namespace) -> None:
    from commitenv.evaluation import run_episode
    from commitenv_controllers import make
    from commitenv_controllers.epact import EPACT
    from commitenv.sim.lref import reference_latency
    from commitenv.sim.pool import REPLAY_SLOT_BASE

    kw = {}
    for item in args.kw or []:
        k, v = item.split("=", 1)
        try:
            kw[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            kw[k] = v
    rec: dict = {}
    if args.controller in ("epact", "static_target"):
        ctrl = EPACT(workers=args.workers, static_target=args.controller == "static_target", **kw)
        ctrl.name = args.controller
        orig_reset, orig_act = ctrl.reset, ctrl.act
        dec: list[dict] = []
        state: dict = {}
        evals: list[tuple] = []  # every evaluated candidate of every decision
        cap: dict[int, list] = {}  # slot -> [times captured, predicted finish first, last, time first]

        def reset(ctx, seed=None):
            orig_reset(ctx, seed)
            w = ctrl.workers
            inner = w.evaluate
            inner_begin = w.begin

            def begin(snap, replay, horizon_s, *a, **k):
                inner_begin(snap, replay, horizon_s, *a, **k)
                # deadlines and arrivals of captured and forecast requests, for margin-rule counterfactuals
                live = dict(zip(snap.requests.slot.tolist(), snap.requests.arrival_s.tolist()))
                slots = list(snap.deadlines)
                state["cap"] = (slots, np.array([live[s_] for s_ in slots]), np.array([snap.deadlines[s_] for s_ in slots]))
                prof = snap.pool.profiles[0]
                if replay is not None and len(replay):
                    sel = replay.arrival_s < snap.t + horizon_s
                    arr, pr, o = replay.arrival_s[sel], replay.prompt_tokens[sel], replay.output_tokens[sel]
                    lim = prof.scheduler.context_limit
                    o = np.minimum(o, np.maximum(lim - pr, 1))
                    dl = arr + snap.pool.opt.alpha * reference_latency(prof, pr, o)
                    state["fc"] = (arr, dl, pr < lim)
                else:
                    state["fc"] = (np.zeros(0), np.zeros(0), np.zeros(0, bool))

            w.begin = begin

            def evaluate(configs):
                preds = inner(configs)
                for c, p in zip(configs, preds):
                    state["preds"][tuple(c)] = p
                    slots, ca, cd = state["cap"]
                    cf = np.array([p.finish[s_] for s_ in slots])
                    fa, fd, fv = state["fc"]
                    ff = np.array([p.finish.get(REPLAY_SLOT_BASE + i, math.inf) for i in range(len(fa))])
                    extra = []
                    for delta in MARGINS:
                        extra.append(int(((cf - ca) * (1 + delta) > cd - ca).sum()))
                        extra.append(int((((ff - fa) * (1 + delta) > fd - fa) & fv).sum()) if len(fa) else 0)
                    state["extra"][tuple(c)] = extra
                return preds

            w.evaluate = evaluate

        def act(obs, info):
            state["preds"] = {}
            state["extra"] = {}
            action = orig_act(obs, info)
            d = ctrl.decisions[-1]
            ch = d["chosen"]
            row = {"t": d["t"], "active": -1, "clock": -1, "n_cap": d["captured"], "n_snap": 0, "misses": -1,
                   "f_misses": -1, "f_n": 0, "admitted": False, "fallback": d["fallback"], "target": d["target_j"],
                   "energy": math.nan}
            if ch is not None:
                p = state["preds"][tuple(ch)]
                row.update(active=ch[0], clock=ch[1], misses=p.misses, f_misses=p.forecast_misses, f_n=p.forecast_n,
                           n_snap=sum(1 for s in p.finish if s < REPLAY_SLOT_BASE), energy=p.energy_j)
                tot = p.misses + (p.forecast_misses if ctrl.slo_scope != "captured" else 0)
                row["admitted"] = bool(p.complete and tot <= math.floor(ctrl.ctx.epsilon * d["captured"] + 1e-9))
                for slot, f in p.finish.items():
                    if slot >= REPLAY_SLOT_BASE:
                        continue
                    c = cap.get(slot)
                    if c is None:
                        cap[slot] = [1, f, f, d["t"]]
                    else:
                        c[0] += 1
                        c[2] = f
            dec.append(row)
            for (a, c), p in state["preds"].items():
                evals.append((d["t"], a, c, p.energy_j, p.misses, p.forecast_misses, p.forecast_n, p.worst_margin_s,
                              p.forecast_margin_s, float(p.complete), d["target_j"], *state["extra"][(a, c)]))
            return action

        ctrl.reset, ctrl.act = reset, act
        rec["decisions"] = dec
        rec["cap"] = cap
        rec["evals"] = evals
    else:
        ctrl = make(args.controller)
    t0 = time.perf_counter()
    env, res = run_episode(ctrl, args.scenario, args.seed, progress=not args.quiet)
    wall = time.perf_counter() - t0
    pool, table = env.pool, env.table
    n = len(table)
    out = {
        "arrival": table.arrival_s, "deadline": pool.deadline, "finish": pool.finish_t, "lref": pool.lref,
        "out": pool.out_tokens, "pred": pool.pred_out, "prompt": table.prompt_tokens,
        "first_t": pool.first_t, "preempt": pool.preemptions,
        "h_t": np.asarray([h["t"] for h in env.history]), "h_energy": np.asarray([h["interval_j"] for h in env.history]),
    }
    if "decisions" in rec:
        ncap = np.zeros(n, np.int32)
        f_first = np.full(n, np.nan)
        f_last = np.full(n, np.nan)
        t_first = np.full(n, np.nan)
        for slot, (c, f1, f2, t1) in rec["cap"].items():
            ncap[slot], f_first[slot], f_last[slot], t_first[slot] = c, f1, f2, t1
        pred_miss_any = (f_first > pool.deadline) | (f_last > pool.deadline)
        out.update(ncap=ncap, f_first=f_first, f_last=f_last, t_first=t_first, pred_miss_any=pred_miss_any)
        out["evals"] = np.asarray(rec["evals"], dtype=np.float64)
        keys = rec["decisions"][0].keys()
        for k in keys:
            out["d_" + k] = np.asarray([r[k] for r in rec["decisions"]], dtype=np.float64)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **out)
    summ = dict(res.summary)
    summ["wall_total_s"] = wall
    summ["kwargs"] = kw
    Path(args.out).with_suffix(".json").write_text(json.dumps(summ, indent=2, default=str) + "\n")
    Path(args.out).with_suffix(".hourly.json").write_text(json.dumps(res.hourly, indent=1) + "\n")
    print(json.dumps({k: summ[k] for k in ("attainment_pct", "cost_kwh_eq", "mean_abs_dev_pct", "hours_within_5pct",
                                            "energy_mj", "misses", "wall_s") if k in summ}))


def _pct(a: int, b: int) -> str:
    return f"{a} ({100.0 * a / max(b, 1):.1f} %)"


def _report(args: argparse.Namespace) -> None:
    d = dict(np.load(args.npz))
    n = len(d["arrival"])
    miss = ~(d["finish"] <= d["deadline"])
    M = int(miss.sum())
    print(f"requests {n}, misses {M} ({100 * M / n:.3f} %), attainment {100 - 100 * M / n:.3f} %")
    hour = (d["arrival"] // 3600).astype(int)
    print("\nby arrival hour: misses / arrivals (miss %)")
    for h in range(hour.max() + 1):
        s = hour == h
        print(f"  h{h:02d}: {int(miss[s].sum()):5d} / {int(s.sum()):6d}  ({100 * miss[s].mean():.3f} %)")
    under = d["out"] > d["pred"]
    print("\ntrue output > predicted output (predictor under-estimated):")
    print(f"  all requests: {_pct(int(under.sum()), n)};  misses: {_pct(int((under & miss).sum()), M)}")
    r = d["out"] / np.maximum(d["pred"], 1)
    for lo, hi in [(0, 0.8), (0.8, 1.0), (1.0, 1.25), (1.25, 1.5), (1.5, 2.0), (2.0, 1e9)]:
        s = (r > lo) & (r <= hi)
        print(f"  true/pred in ({lo}, {hi}]: {int(s.sum()):7d} requests, {int((s & miss).sum()):5d} misses "
              f"(miss rate {100 * (s & miss).sum() / max(s.sum(), 1):.3f} %)")
    late = (d["finish"] - d["deadline"])
    rel = late / np.maximum(d["deadline"] - d["arrival"], 1e-9)
    print("\nhow late (finish - deadline), misses only:")
    unfinished = miss & ~np.isfinite(d["finish"])
    print(f"  never finished: {int(unfinished.sum())}")
    lm = late[miss & np.isfinite(d["finish"])]
    rm = rel[miss & np.isfinite(d["finish"])]
    if len(lm):
        print("  seconds late quantiles 10/50/90/max: " + ", ".join(f"{np.quantile(lm, q):.2f}" for q in (.1, .5, .9, 1.0)))
        print("  relative to the SLO window (d - a): " + ", ".join(f"{np.quantile(rm, q):.3f}" for q in (.1, .5, .9, 1.0)))
        for lo, hi in [(0, 0.01), (0.01, 0.05), (0.05, 0.2), (0.2, 1e9)]:
            s = (rm > lo) & (rm <= hi)
            print(f"    late by ({lo}, {hi}] of the window: {int(s.sum())}")
    win = d["deadline"] - d["arrival"]
    print("\nSLO window (d - a) quantiles of misses vs all: "
          + ", ".join(f"{np.quantile(win[miss], q):.1f}" for q in (.1, .5, .9)) + " vs "
          + ", ".join(f"{np.quantile(win, q):.1f}" for q in (.1, .5, .9)))
    if "ncap" in d:
        cap = d["ncap"] > 0
        print("\ncaptured in a snapshot (unfinished at >= 1 decision) vs only forecast-governed (finished in its "
              "arrival interval):")
        print(f"  captured: {_pct(int(cap.sum()), n)} of requests; misses captured {_pct(int((cap & miss).sum()), M)}")
        print(f"  miss rate captured {100 * (miss & cap).sum() / max(cap.sum(), 1):.3f} %, "
              f"never captured {100 * (miss & ~cap).sum() / max((~cap).sum(), 1):.3f} %")
        pm = d["pred_miss_any"]
        print(f"  captured misses the chosen config predicted to miss at some decision: {_pct(int((pm & miss).sum()), int((cap & miss).sum()))}")
        print(f"  predicted-miss requests that actually met: {int((pm & ~miss).sum())}")
        # first capture: predicted slack
        fl = d["f_first"]
        ok = cap & miss & np.isfinite(fl)
        err = (d["finish"] - fl)[ok]
        print("  misses: true finish - predicted finish at first capture, s, quantiles 10/50/90: "
              + ", ".join(f"{np.quantile(err, q):.2f}" for q in (.1, .5, .9)) if len(err) else "")
        sl = (d["deadline"] - fl)[ok]
        print("  misses: predicted margin (deadline - predicted finish) at first capture, s, q10/50/90: "
              + ", ".join(f"{np.quantile(sl, q):.2f}" for q in (.1, .5, .9)) if len(sl) else "")
        ok2 = cap & np.isfinite(fl) & np.isfinite(d["finish"])
        rel_err = ((d["finish"] - fl) / np.maximum(fl - d["t_first"], 1e-3))[ok2]
        print("  all captured: (true - predicted remaining) / predicted remaining at first capture, q50/90/95/99: "
              + ", ".join(f"{np.quantile(rel_err, q):.3f}" for q in (.5, .9, .95, .99)))
        print("\ndecisions:")
        dm = d["d_misses"]
        dn = d["d_n_cap"]
        print(f"  {len(dm)} decisions; fallback searches {int(d['d_fallback'].sum())}; "
              f"chosen with > 0 predicted misses (captured + forecast): {int(((dm + d['d_f_misses']) > 0).sum())}")
        print(f"  predicted misses of chosen (captured+forecast) sum {int((dm + d['d_f_misses']).sum())}, "
              f"of which captured {int(dm.sum())}, forecast {int(d['d_f_misses'].sum())}; "
              f"allowed sum floor(eps*n) {int(np.floor(0.01 * dn + 1e-9).sum())}")
    if args.baseline:
        b = dict(np.load(args.baseline))
        bm = ~(b["finish"] <= b["deadline"])
        print(f"\nbaseline misses {int(bm.sum())}; shared with this run {int((bm & miss).sum())}; "
              f"only here {int((miss & ~bm).sum())}; only baseline {int((bm & ~miss).sum())}")
        s = miss & ~bm
        if "ncap" in d:
            print(f"  misses only here: captured {_pct(int((s & (d['ncap'] > 0)).sum()), int(s.sum()))}, "
                  f"true>pred {_pct(int((s & under).sum()), int(s.sum()))}")
        print("  misses only here by arrival hour: " + " ".join(f"{h}:{int((s & (hour == h)).sum())}" for h in range(hour.max() + 1)))


def _counterfactual(args: argparse.Namespace) -> None:
    """Re-select every recorded decision of an ePACT run under another rule (first order: the same candidate
    predictions, no feedback) and sum the chosen candidates' predicted misses (no margin), against eq. 3."""
    d = dict(np.load(args.npz))
    E = d["evals"]  # t, active, clock, energy, misses, f_misses, f_n, margin, f_margin, complete, target, margins...
    groups = np.split(E, np.flatnonzero(np.diff(E[:, 0])) + 1)
    lp, lm, eps = args.lambda_plus, args.lambda_minus, args.epsilon
    pe, ae = d["d_energy"], d["h_energy"]
    rel = np.abs(ae - pe) / np.abs(pe)
    print(f"applied candidates' energy prediction |error|: median {np.median(rel):.4f}, q90 {np.quantile(rel, .9):.4f}, "
          f"rms {np.sqrt(np.mean(((ae - pe) / pe) ** 2)):.4f}")
    for mi in args.margin_idx:
        for tol in args.band:
            tot = dj = de = changed = 0.0
            for k, R in enumerate(groups):
                T, n = R[0, 10], d["d_n_cap"][k]
                allow = math.floor(eps * n + 1e-9)
                m0 = R[:, 4] + R[:, 5]
                m = R[:, 11 + 2 * mi] + R[:, 12 + 2 * mi]
                j = lp * np.maximum(R[:, 3] - T, 0) + lm * np.maximum(T - R[:, 3], 0)
                marg = np.minimum(R[:, 7], R[:, 8])
                adm0 = (R[:, 9] > 0) & (m0 <= allow)
                adm = (R[:, 9] > 0) & (m <= allow)
                rng = range(len(R))
                i0 = min(rng, key=lambda i: (0, j[i], m0[i], -marg[i]) if adm0[i] else (1, m0[i], -marg[i], j[i]))
                if adm.any():
                    ok = adm & (j <= j[adm].min() + tol * abs(T) * min(lp, lm))
                    best = min(np.flatnonzero(ok), key=lambda i: (m[i], j[i], -marg[i], R[i, 1], R[i, 2]))
                else:
                    best = min(rng, key=lambda i: (m[i], -marg[i], j[i], R[i, 1], R[i, 2]))
                tot += m0[best]
                dj += j[best] - j[i0]
                de += R[best, 3] - R[i0, 3]
                changed += best != i0
            print(f"latency margin {MARGINS[mi]:.2f}, energy band {tol:.3f}: predicted misses {tot:.0f}, "
                  f"extra J {dj / 3.6e6:.3f} kWh-eq, extra energy {de / 1e6:.2f} MJ, decisions changed {changed:.0f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("scenario")
    r.add_argument("--controller", default="epact")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--workers", type=int, default=1)
    r.add_argument("--kw", action="append")
    r.add_argument("--out", required=True)
    r.add_argument("--quiet", action="store_true")
    p = sub.add_parser("report")
    p.add_argument("npz")
    p.add_argument("--baseline")
    c = sub.add_parser("counterfactual")
    c.add_argument("npz")
    c.add_argument("--band", type=float, nargs="+", default=[0.0, 0.01, 0.02, 0.03, 0.05])
    c.add_argument("--margin-idx", type=int, nargs="+", default=[0], help="indices into MARGINS")
    c.add_argument("--lambda-plus", type=float, default=2.0)
    c.add_argument("--lambda-minus", type=float, default=1.0)
    c.add_argument("--epsilon", type=float, default=0.01)
    a = ap.parse_args()
    {"run": _run, "report": _report, "counterfactual": _counterfactual}[a.cmd](a)


if __name__ == "__main__":
    main()
