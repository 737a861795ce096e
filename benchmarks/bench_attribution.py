"""StepSplit attribution: online-ledger cost per step, scheduler-replay cost per coalition, and accuracy on trace
windows of the Azure conversation trace at 10x its rate (StepSplit sections 6.4 and 6.8).

* Ledger: the engine logs every step (closed-form decode runs off, as a step-by-step engine reports them) over
  a stretch of the trace; the ledger consumes the log with 1 s windows metered from the pool. Reported per step
  and per log entry of the default engine (whose decode runs are one entry each).
* Replay: mean wall time of one coalition replay (a fresh engine serving the coalition) while sampling, for
  windows of 16-128 requests; and the full window served once.
* Accuracy: windows of the first 32, 64, 128 requests of one 128-request window, served from an idle engine
  (noise off: the engine is the ground truth, so the replay game is the game to attribute). Reference: the
  replay game's Shapley value from many antithetic pairs with the model-game control variate (its own sampling
  noise is reported). Compared: Token (p + 5d), Solo (each request served alone), time sharing, the closed form
  on the logged timeline (no replay), and the replay-corrected estimate from few pairs (independent seed).
  Every split is normalised to the window's energy; L1 = sum |x - ref| / total.
* Prefix caching (section 6.7, Table 5): groups of 8 requests with the engine's prefix cache on (hash blocks of
  the profile's KV block size): "System prompt" (a common 1,024-token system prompt before 8 conversation
  prompts) and "Nested" (each prompt a prefix of the next, as in a multi-turn conversation), static (all at
  t = 0) and continuous (0.5 s apart). Reference: exact Shapley of the engine's replay game (255 coalitions).
  Compared: Token (cached tokens billed as computed), Solo, First (step sharing on the logged steps, which
  charges a block to whoever computed it), StepSplit (step sharing plus the equal split of each block) and
  StepSplit with the replay correction (20 sampled pairs, the prefix model game as control variate).

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from commitenv.attribution import (
    Ledger,
    ReplayGame,
    StepLaw,
    closed_form_for,
    decompose,
    exact_shapley,
    l1_distance,
    ledger_horizon,
    model_game_for,
    sample_shapley,
    solo_split,
    time_sharing_split,
    token_split,
)
from commitenv.attribution.prefix import prefix_split
from commitenv.profiles import load_profile
from commitenv.sim import EngineOptions, NoiseSpec, Pool, PoolLayout
from commitenv.workload import builtin_workload
from commitenv.workload.loaders import load_azure_csv
from commitenv.workload.table import RequestTable
from commitenv.workload.transforms import compress_time

TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv_2023.csv"


def load_trace(rate: float) -> tuple[RequestTable, str]:
    if TRACE.exists():
        return compress_time(load_azure_csv(TRACE), rate), TRACE.name
    return compress_time(builtin_workload("azure-conv-hour"), rate), "azure-conv-hour (builtin)"


def rebased(table: RequestTable, idx: np.ndarray) -> RequestTable:
    sub = table.take(idx)
    return RequestTable(sub.arrival_s - sub.arrival_s[0], sub.prompt_tokens, sub.output_tokens, sub.tenant,
                        sub.request_id, sub.tenant_names, None, None, sub.source, dict(sub.meta))


def serve(profile, table, *, closed_form=True, noise=False):
    pool = Pool(profile, PoolLayout.single(1),
                EngineOptions(noise=NoiseSpec() if noise else NoiseSpec(0, 0), log_steps=True, closed_form=closed_form))
    pool.attach(table)
    return pool


def bench_ledger(profile, trace: RequestTable, start: int, seconds: float, closed_form: bool) -> dict:
    t_lo = float(trace.arrival_s[start])
    idx = np.flatnonzero((trace.arrival_s >= t_lo) & (trace.arrival_s < t_lo + seconds))
    table = rebased(trace, idx)
    pool = serve(profile, table, closed_form=closed_form)
    led = Ledger(StepLaw.from_pool(pool), table, pool.out_tokens)
    spent = 0.0
    t = 0.0
    while pool.live or pool.arrived < len(table):
        t += 1.0
        pool.run_until(t)
        pool.settle(t)
        c0 = time.perf_counter()
        led.sync(pool.log)
        led.close_from_pool(pool, t)
        led.settle(ledger_horizon(pool))
        spent += time.perf_counter() - c0
    c0 = time.perf_counter()
    led.sync(pool.log)
    led.settle()
    spent += time.perf_counter() - c0
    busy = sum(w.busy_j for w in led.windows)
    billed = sum(led.bills.values())
    return {
        "requests": len(table),
        "steps": led.steps,
        "entries": led.entries,
        "mean_m": float(np.mean([len(e.slots) for e in pool.log])),
        "us_per_step": 1e6 * spent / led.steps,
        "us_per_entry": 1e6 * spent / led.entries,
        "billed_over_busy": billed / busy,
    }


def accuracy(profile, window: RequestTable, *, ref_pairs: int, pairs: int, workers: int) -> dict:
    n = len(window)
    pool = serve(profile, window)
    pool.run_until(math.inf)
    law = StepLaw.from_profiles(profile)
    total = sum(e.energy_j for e in pool.log)
    steps = decompose(pool.log, window, law, players=range(n))
    control = model_game_for(pool.log, window, law)
    game = ReplayGame(window, profile, law=law, own=steps.own_per_player())
    t0 = time.perf_counter()
    full = game.serve(range(n))
    full_ms = 1e3 * (time.perf_counter() - t0)
    ref = sample_shapley(game, ref_pairs, seed=10_000 + n, control=control, workers=workers)
    r0, s0 = game.counters["replays"], game.counters["replay_s"]
    t0 = time.perf_counter()
    est = sample_shapley(game, pairs, seed=n, control=control, workers=workers)
    est_wall = time.perf_counter() - t0
    dr, ds = game.counters["replays"] - r0, game.counters["replay_s"] - s0
    refv = ref.phi * total / ref.phi.sum()
    splits = {
        "token": token_split(window.prompt_tokens, pool.out_tokens, total).shares,
        "solo": solo_split(game, total).shares,
        "time_sharing": time_sharing_split(steps, total).shares,
        "noreplay": closed_form_for(pool.log, window, law, total_j=total).shares,
        "replay": est.phi * total / est.phi.sum(),
    }
    out = {f"l1_{k}": l1_distance(v, refv, total) for k, v in splits.items()}
    out.update({
        "requests": n,
        "logged_steps": steps.total_steps,
        "replayed_full_steps": int(sum(e.n_steps for e in full.log)),
        "mean_m": float(steps.steps_per_player().sum() / steps.total_steps),
        "shared_fraction": float(steps.shared_law.sum() / steps.law_j.sum()),
        "ref_pairs": ref_pairs,
        "ref_noise_l1": ref.l1_noise(),
        "pairs": pairs,
        "replay_noise_l1": est.l1_noise(),
        "replay_ms_per_coalition": 1e3 * ds / max(dr, 1),
        "replays": dr,
        "replay_wall_s": est_wall,
        "full_window_replay_ms": full_ms,
    })
    return out


def prefix_group(kind: str, trace: RequestTable, start: int, bt: int, n: int = 8) -> RequestTable:
    """A Table-5 style group of ``n`` requests with hash blocks of ``bt`` tokens (ids name whole prefixes)."""
    x = trace.prompt_tokens[start : start + n].astype(np.int64)
    d = trace.output_tokens[start : start + n].astype(np.int64)
    if kind == "system":
        prompts = 1024 + x
        hashes = [list(range(1024 // bt)) + [10_000 * (i + 1) + j for j in range(int(p) // bt - 1024 // bt)]
                  for i, p in enumerate(prompts)]
    elif kind == "nested":  # turn i's prompt: all earlier turns and answers, then its own text
        x = np.minimum(x, 1024)
        prompts = np.cumsum(x + np.concatenate([[0], d[:-1]]))
        hashes = [list(range(int(p) // bt)) for p in prompts]
    else:
        raise ValueError(kind)
    offs = np.concatenate([[0], np.cumsum([len(h) for h in hashes])]).astype(np.int64)
    flat = np.asarray([v for h in hashes for v in h], dtype=np.int64)
    return RequestTable(np.zeros(n), prompts.astype(np.int64), d, np.zeros(n, dtype=np.int32), np.arange(n),
                        ("default",), offs, flat, f"prefix-{kind}")


def prefix_accuracy(profile, group: RequestTable, spacing: float) -> dict:
    n = len(group)
    bt = profile.scheduler.block_size
    table = RequestTable(np.arange(n) * spacing, group.prompt_tokens, group.output_tokens, group.tenant,
                         group.request_id, group.tenant_names, group.prefix_offsets, group.prefix_hashes, group.source)
    opts = dict(noise=NoiseSpec(0, 0), log_steps=True, prefix_block_tokens=bt)
    pool = Pool(profile, PoolLayout.single(1), EngineOptions(**opts))
    pool.attach(table)
    pool.run_until(math.inf)
    off = Pool(profile, PoolLayout.single(1), EngineOptions(**opts, prefix_caching=False))
    off.attach(table)
    off.run_until(math.inf)
    law = StepLaw.from_profiles(profile)
    total = sum(e.energy_j for e in pool.log)
    game = ReplayGame(table, profile, law=law, prefix_block_tokens=bt)
    t0 = time.perf_counter()
    ref = exact_shapley(game)
    wall = time.perf_counter() - t0
    ref = ref * total / ref.sum()
    splits = {
        "token": token_split(table.prompt_tokens, pool.out_tokens, total).shares,
        "solo": solo_split(game, total).shares,
        "first": closed_form_for(pool.log, table, law, total_j=total).shares,
        "stepsplit": prefix_split(pool.log, table, law, bt, players=range(n), total_j=total).shares,
    }
    # StepSplit with the replay correction: 20 sampled pairs, the prefix model game as control variate
    control = model_game_for(pool.log, table, law, prefix_block_tokens=bt)
    est = sample_shapley(game, 20, seed=1, control=control)
    splits["stepsplit_replay"] = est.phi * total / est.phi.sum()
    out = {f"l1_{k}": l1_distance(v, ref, total) for k, v in splits.items()}
    out["cache_saving"] = 1.0 - total / sum(e.energy_j for e in off.log)
    out["exact_wall_s"] = wall
    return out


def replay_cost(profile, window: RequestTable, pairs: int) -> float:
    game = ReplayGame(window, profile)
    sample_shapley(game, pairs, seed=1)
    return game.replay_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="h100-qwen2.5-7b")
    ap.add_argument("--rate", type=float, default=10.0, help="trace time compression")
    ap.add_argument("--start", type=int, default=6000, help="index of the window's first request in the trace")
    ap.add_argument("--token-budget", type=int, default=None, help="override the profile's per-step token budget")
    ap.add_argument("--ref-pairs", default="32:1000,64:500,128:400",
                    help="reference pairs per window size ('N:pairs,...'), or one number for all")
    ap.add_argument("--pairs", type=int, default=50)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ledger-seconds", type=float, default=30.0)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = ap.parse_args()
    prof = load_profile(args.profile)
    if args.token_budget:
        prof = prof.model_copy(update={"scheduler": prof.scheduler.model_copy(update={"token_budget": args.token_budget})})
    trace, source = load_trace(args.rate)
    sizes = (16, 32) if args.quick else (32, 64, 128)
    if args.quick:
        ref_of = {n: 20 for n in sizes}
    elif ":" in args.ref_pairs:
        ref_of = {int(k): int(v) for k, v in (x.split(":") for x in args.ref_pairs.split(","))}
    else:
        ref_of = {n: int(args.ref_pairs) for n in sizes}
    t_all = time.perf_counter()

    ledger_step = bench_ledger(prof, trace, args.start, args.ledger_seconds / (4 if args.quick else 1), closed_form=False)
    ledger_run = bench_ledger(prof, trace, args.start, args.ledger_seconds / (4 if args.quick else 1), closed_form=True)
    print(f"ledger, every step logged: {ledger_step['requests']} requests, {ledger_step['steps']} steps, mean m "
          f"{ledger_step['mean_m']:.1f}: "
          f"{ledger_step['us_per_step']:.1f} us/step (paper: 47 us); bills/busy = {ledger_step['billed_over_busy']:.12f}")
    print(f"ledger, decode runs: {ledger_run['entries']} entries for {ledger_run['steps']} steps: "
          f"{ledger_run['us_per_entry']:.1f} us/entry, {ledger_run['us_per_step']:.2f} us/step")

    window128 = rebased(trace, np.arange(args.start, args.start + max(sizes)))
    costs = {}
    costs[16] = replay_cost(prof, rebased(trace, np.arange(args.start, args.start + 16)), 10)
    acc = {}
    for n in sizes:
        w = rebased(window128, np.arange(n))
        ref_pairs = ref_of[n]
        acc[n] = a = accuracy(prof, w, ref_pairs=ref_pairs, pairs=args.pairs, workers=args.workers)
        costs[n] = a["replay_ms_per_coalition"]
        print(f"window {n}: {a['logged_steps']} logged steps (full replay {a['replayed_full_steps']}), mean m "
              f"{a['mean_m']:.1f}, shared {a['shared_fraction']:.3f}; reference {ref_pairs} pairs (noise "
              f"{a['ref_noise_l1']:.4f}); L1 token {a['l1_token']:.3f} solo {a['l1_solo']:.3f} time-sharing "
              f"{a['l1_time_sharing']:.3f} no-replay {a['l1_noreplay']:.4f} replay({args.pairs} pairs) "
              f"{a['l1_replay']:.4f} (noise {a['replay_noise_l1']:.4f}); replay {a['replay_ms_per_coalition']:.2f} "
              f"ms/coalition, full window {a['full_window_replay_ms']:.2f} ms, {a['replay_wall_s']:.1f} s wall")
    print("replay ms per coalition: " + ", ".join(f"{n}: {c:.2f}" for n, c in sorted(costs.items()))
          + " (paper 0.23-7.74 ms)")
    prefix = {}
    for kind in ("system", "nested"):
        group = prefix_group(kind, trace, args.start + 200, prof.scheduler.block_size)
        for batching, spacing in (("static", 0.0), ("continuous", 0.5)):
            prefix[f"{kind}_{batching}"] = q = prefix_accuracy(prof, group, spacing)
            print(f"prefix {kind:6s} {batching:10s}: cache saves {100 * q['cache_saving']:.1f} % of the group energy; "
                  f"L1 token {q['l1_token']:.3f} solo {q['l1_solo']:.3f} first {q['l1_first']:.4f} "
                  f"stepsplit {q['l1_stepsplit']:.4f} stepsplit+replay(20 pairs) {q['l1_stepsplit_replay']:.4f} "
                  f"(exact reference, {q['exact_wall_s']:.2f} s)")
    big = max(sizes)
    res = {
        "profile": prof.name,
        "trace": source,
        "rate": args.rate,
        "token_budget": prof.scheduler.token_budget,
        "ledger_us_per_step": ledger_step["us_per_step"],
        "ledger_us_per_entry_runs": ledger_run["us_per_entry"],
        "ledger": {"every_step": ledger_step, "decode_runs": ledger_run},
        "replay_ms": {str(n): c for n, c in sorted(costs.items())},
        f"replay_ms_{big}": costs[big],
        "windows": {str(n): a for n, a in acc.items()},
        f"l1_token_{big}": acc[big]["l1_token"],
        f"l1_solo_{big}": acc[big]["l1_solo"],
        f"l1_noreplay_{big}": acc[big]["l1_noreplay"],
        f"l1_replay_{big}": acc[big]["l1_replay"],
        "prefix": prefix,
        "l1_prefix_first_max": max(q["l1_first"] for q in prefix.values()),
        "l1_prefix_stepsplit_max": max(q["l1_stepsplit"] for q in prefix.values()),
        "l1_prefix_stepsplit_replay_max": max(q["l1_stepsplit_replay"] for q in prefix.values()),
        "wall_s": time.perf_counter() - t_all,
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
