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
* Preemption (issue 14): a replica with a tight KV cache (3,200 tokens, token budget 512, context limit 2,048)
  serves the first 7-request window of the trace at or after ``--preempt-start`` in which a request is preempted
  at least 10 times. Reference: the exact Shapley value of the engine's busy energy, enumerated over 127 engine
  runs (noise off). Compared: the closed form on the logged run (the bills), the replay game with own energy
  fixed at the full run's (``own_mode="fixed"``, Eq. (6)) and replayed per coalition (``"replayed"``, the
  default), Token.
* Co-located GPU: two 0.5-share instances of the model on one GPU behind the least-loaded router, 8 requests of
  the trace from ``--start``. Reference: exact Shapley of the GPU's metered busy energy (the idle floor counted
  once over the time any step runs, as the meter does), enumerated over 255 engine runs. Compared: the bills
  (`PoolAttributor`: the floor split among the steps running at each instant, then the closed form), the closed
  form of the log, the replay game fixed / replayed (law energies per instance), Token.
* ``--prefix-limits``: the limits of the prefix split (docs/results/attribution-replay.md): the Table-5 groups with
  overlapping arrivals (0.05 s apart) and with a 512-token budget that chunks the prompts (0.5 s apart and static).

Figures are printed beside the machine factor of ../shared/tools/machine_factor.py (1.0 = the reference machine).
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
    PoolAttributor,
    ReplayGame,
    StepLaw,
    closed_form_for,
    decompose,
    exact_shapley,
    l1_distance,
    ledger_horizon,
    model_game_for,
    sample_shapley,
    shapley_from_values,
    solo_split,
    time_sharing_split,
    token_split,
)
from commitenv.attribution.prefix import prefix_split
from commitenv.attribution.replay import floor_overlap_j
from commitenv.profiles import load_profile
from commitenv.sim import EngineOptions, Instance, NoiseSpec, Pool, PoolLayout
from commitenv.workload import builtin_workload
from commitenv.workload.loaders import load_azure_csv
from commitenv.workload.table import RequestTable
from commitenv.workload.transforms import compress_time
from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)

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


def bench_ledger(profile, trace: RequestTable, start: int, seconds: float, closed_form: bool, repeats: int = 3) -> dict:
    """The ledger fed live (1 s windows, settled up to the horizon) while the engine serves ``seconds`` of the
    trace; only the ledger's calls are timed. One warm-up run, then ``repeats`` runs: the median is reported."""
    t_lo = float(trace.arrival_s[start])
    idx = np.flatnonzero((trace.arrival_s >= t_lo) & (trace.arrival_s < t_lo + seconds))
    table = rebased(trace, idx)
    runs = []
    for _ in range(repeats + 1):
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
        runs.append(spent)
    spent = float(np.median(runs[1:]))
    busy = sum(w.busy_j for w in led.windows)
    billed = sum(led.bills.values())
    return {
        "requests": len(table),
        "steps": led.steps,
        "entries": led.entries,
        "mean_m": float(np.mean([len(e.slots) for e in pool.log])),
        "us_per_step": 1e6 * spent / led.steps,
        "us_per_step_runs": [1e6 * x / led.steps for x in runs[1:]],
        "us_per_step_first_run": 1e6 * runs[0] / led.steps,
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


# ------------------------------------------------------------------------------------------ engine games
def engine_busy_j(profile, layout: PoolLayout, table: RequestTable) -> float:
    """Busy energy the GPU meters count while serving ``table`` alone (noise off): every step's energy above the
    idle floor, plus the floor over the time any step runs on each GPU (once on a GPU hosting several instances;
    on one instance this is the sum of the step energies)."""
    pool = Pool(profile, layout, EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(table)
    pool.run_until(math.inf)
    return math.fsum(e.energy_j for e in pool.log) + floor_overlap_j(pool.log)


def engine_shapley(profile, layout: PoolLayout, table: RequestTable) -> np.ndarray:
    """Exact Shapley value of the engine's busy energy: every coalition served alone (2**n - 1 engine runs)."""
    n = len(table)
    v = np.zeros(1 << n)
    for mask in range(1, 1 << n):
        v[mask] = engine_busy_j(profile, layout, table.take(np.array([i for i in range(n) if mask >> i & 1])))
    return shapley_from_values(v)


def tight_profile(profile):
    """The issue's small replica: KV cache 3,200 tokens, token budget 512 (context limit 2,048 to fit)."""
    sch = profile.scheduler.model_copy(update={"token_budget": 512, "kv_capacity_tokens": 3200,
                                               "context_limit": 2048})
    return profile.model_copy(update={"scheduler": sch})


def replay_splits(profile, layout: PoolLayout, window: RequestTable, total: float) -> dict:
    out = {}
    for mode in ("fixed", "replayed"):
        phi = exact_shapley(ReplayGame(window, profile, layout, own_mode=mode))
        out[f"replay_{mode}"] = phi * total / phi.sum()
    return out


def preemption_case(profile, trace: RequestTable, start: int, n: int = 7) -> dict:
    prof = tight_profile(profile)
    lim = prof.scheduler.context_limit
    law = StepLaw.from_profiles(prof)
    if start >= len(trace) - n:  # a shorter (built-in) trace: search from its start
        start = 0
    for s in range(start, min(start + 5000, len(trace) - n)):
        w = rebased(trace, np.arange(s, s + n))
        if np.any(w.prompt_tokens + w.output_tokens > lim):
            continue
        pool = serve(prof, w)
        pool.run_until(math.inf)
        if pool.preemptions.max() >= 10:
            break
    else:
        raise RuntimeError(f"no {n}-request window with 10 preemptions from {start}")
    t0 = time.perf_counter()
    ref = engine_shapley(prof, PoolLayout.single(1), w)
    total = float(ref.sum())
    splits = {
        "closed_form": closed_form_for(pool.log, w, law, total_j=total).shares,
        **replay_splits(prof, PoolLayout.single(1), w, total),
        "token": token_split(w.prompt_tokens, pool.out_tokens, total).shares,
    }
    i = int(np.argmax(pool.preemptions))
    out = {f"l1_{k}": l1_distance(v, ref, total) for k, v in splits.items()}
    out.update({
        "start": s, "requests": n, "token_budget": prof.scheduler.token_budget,
        "kv_capacity_tokens": prof.scheduler.kv_capacity_tokens, "preemptions": pool.preemptions.tolist(),
        "energy_j": total, "preempted": i,
        "preempted_recompute_j": float(ReplayGame(w, prof).recompute_j()[i]),
        "preempted_bill_j": {k: float(v[i]) for k, v in splits.items()} | {"exact": float(ref[i])},
        "wall_s": time.perf_counter() - t0,
    })
    return out


def colocated_case(profile, trace: RequestTable, start: int, n: int = 8) -> dict:
    layout = PoolLayout(((Instance(0, 0.5), Instance(0, 0.5)),))
    w = rebased(trace, np.arange(start, start + n))
    t0 = time.perf_counter()
    pool = Pool(profile, layout, EngineOptions(noise=NoiseSpec(0, 0), log_steps=True))
    pool.attach(w)
    att = PoolAttributor(pool)
    t_end = 1.0
    while pool.live or pool.arrived < n:
        pool.run_until(t_end)
        pool.settle(t_end)
        t_end *= 2
    att.close(pool.now)
    ref = engine_shapley(profile, layout, w)
    total = float(ref.sum())
    law = StepLaw.from_profiles(profile, layout)
    splits = {
        "bills": att.bills_j * total / att.bills_j.sum(),
        "closed_form": closed_form_for(pool.log, w, law, total_j=total).shares,
        **replay_splits(profile, layout, w, total),
        "token": token_split(w.prompt_tokens, pool.out_tokens, total).shares,
    }
    out = {f"l1_{k}": l1_distance(v, ref, total) for k, v in splits.items()}
    overlap = sum(e.energy_j for e in pool.log) / total - 1.0  # the floor the step energies count twice
    out.update({"start": start, "requests": n, "instances": [0, 0], "shares": [0.5, 0.5],
                "replica_of": pool.replica_of.tolist(), "bills_over_busy": float(att.bills_j.sum() / total),
                "steps_over_busy_minus_1": overlap, "wall_s": time.perf_counter() - t0})
    return out


def prefix_limits(profile, trace: RequestTable, start: int) -> dict:
    """The prefix split (no replay) against First and the exact replay game: Table-5 groups with overlapping
    arrivals (0.05 s apart, a request still prefills or decodes when the next arrives) and a 512-token budget
    that splits the prompts over steps (0.5 s apart, and all at t = 0)."""
    out = {}
    chunked = profile.model_copy(update={"scheduler": profile.scheduler.model_copy(update={"token_budget": 512})})
    for kind in ("system", "nested"):
        group = prefix_group(kind, trace, start, profile.scheduler.block_size)
        for label, prof, spacing in (("overlap", profile, 0.05), ("budget512", chunked, 0.5),
                                     ("static_budget512", chunked, 0.0)):
            q = prefix_accuracy(prof, group, spacing)
            out[f"{kind}_{label}"] = {k: q[k] for k in ("l1_first", "l1_stepsplit", "l1_stepsplit_replay",
                                                        "cache_saving")}
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
    ap.add_argument("--ledger-only", action="store_true", help="only the ledger's cost per step")
    ap.add_argument("--preempt-start", type=int, default=5887,
                    help="first trace index searched for the preemption-heavy 7-request window")
    ap.add_argument("--prefix-limits", action="store_true",
                    help="also measure the prefix split with overlapping arrivals and a chunking budget")
    args = ap.parse_args()
    factor = machine_factor()
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
          f"{ledger_step['us_per_step']:.1f} us/step, median of "
          f"{', '.join(f'{x:.1f}' for x in ledger_step['us_per_step_runs'])} after a {ledger_step['us_per_step_first_run']:.1f} "
          f"us/step warm-up (paper: 47 us); bills/busy = {ledger_step['billed_over_busy']:.12f}")
    print(f"ledger, decode runs: {ledger_run['entries']} entries for {ledger_run['steps']} steps: "
          f"{ledger_run['us_per_entry']:.1f} us/entry, {ledger_run['us_per_step']:.2f} us/step")
    if args.ledger_only:
        print(f"machine factor {factor} (1.0 = reference)")
        print(json.dumps({"machine_factor": factor, "profile": prof.name, "trace": source, "rate": args.rate,
                          "ledger_us_per_step": ledger_step["us_per_step"],
                          "ledger": {"every_step": ledger_step, "decode_runs": ledger_run}}))
        return

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
    pre = preemption_case(prof, trace, args.preempt_start)
    print(f"preemption (KV {pre['kv_capacity_tokens']} tokens, budget {pre['token_budget']}, trace window at "
          f"{pre['start']}): preemptions {pre['preemptions']}; request {pre['preempted']}: recompute "
          f"{pre['preempted_recompute_j']:.1f} J, bill closed form {pre['preempted_bill_j']['closed_form']:.1f} J, "
          f"replay fixed {pre['preempted_bill_j']['replay_fixed']:.1f} J, replayed "
          f"{pre['preempted_bill_j']['replay_replayed']:.1f} J, exact {pre['preempted_bill_j']['exact']:.1f} J; "
          f"L1 closed form {pre['l1_closed_form']:.3f} replay fixed {pre['l1_replay_fixed']:.3f} replayed "
          f"{pre['l1_replay_replayed']:.2e} token {pre['l1_token']:.3f} ({pre['wall_s']:.1f} s)")
    co = colocated_case(prof, trace, args.start)
    print(f"co-located (two 0.5-share instances on one GPU, routed {co['replica_of']}): L1 bills "
          f"{co['l1_bills']:.4f} closed form {co['l1_closed_form']:.4f} replay fixed {co['l1_replay_fixed']:.2e} "
          f"replayed {co['l1_replay_replayed']:.2e} token {co['l1_token']:.3f}; the instances' step energies add up "
          f"to {100 * co['steps_over_busy_minus_1']:+.1f} % of the metered busy energy ({co['wall_s']:.1f} s)")
    limits = None
    if args.prefix_limits:
        limits = prefix_limits(prof, trace, args.start + 200)
        for k, q in limits.items():
            print(f"prefix limits {k:18s}: L1 first {q['l1_first']:.4f} stepsplit {q['l1_stepsplit']:.4f} "
                  f"stepsplit+replay(20 pairs) {q['l1_stepsplit_replay']:.4f}")
    big = max(sizes)
    res = {
        "machine_factor": factor,
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
        "preemption": pre,
        "colocated": co,
        **({"prefix_limits": limits} if limits is not None else {}),
        "wall_s": time.perf_counter() - t_all,
    }
    print(f"machine factor {factor} (1.0 = reference); wall {res['wall_s']:.1f} s")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
