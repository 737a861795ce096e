"""Markdown tables of a many-seed comparison (``commitenv compare ... --seeds test:5 --out DIR``) with every
controller's gap to the hindsight bound (``oracle``), paired by seed; used for docs/results/baselines.md.

    python benchmarks/baselines_table.py DIR/compare.json [DIR2/compare.json ...]
    python benchmarks/baselines_table.py --merge DIR1 DIR2 ...   # one table of one scenario's per-seed runs

Without an ``oracle`` row the gap is taken to the oracle reference each episode was scored against (its
``upper_cost_kwh_eq``), which is the oracle's run of that episode.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from commitenv.runner import mean_ci95


def _cell(m: dict, fmt: str) -> str:
    return f"{m['mean']:{fmt}} ± {m['half_width']:{fmt}}" if m["n"] > 1 else f"{m['mean']:{fmt}}"


def table(doc: dict, penalty_kwh: float) -> str:
    """One scenario's rows: the normalised score (`commitenv.scoring`), cost, mean |dev|, attainment, misses, total
    (cost + penalty x misses), gap to oracle, SLO gate passes and the mean planning delay charged per decision."""
    rows = {c["controller"]: c for c in doc["controllers"]}
    bound = rows.get("oracle")
    lines = [f"**{doc['scenario']}**, seeds {doc['seeds'][0]}-{doc['seeds'][-1]} (mean ± 95 % t-interval half-width)",
             "",
             "| controller | score | cost kWh-eq | mean abs dev % | attainment % | misses | cost + misses x penalty | "
             "gap to oracle (cost) | SLO gate | planning delay s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in rows.items():
        m = c["metrics"]
        seeds = [str(s) for s in c["seeds"]]
        total = [m["cost_kwh_eq"]["per_seed"][s] + penalty_kwh * m["misses"]["per_seed"][s] for s in seeds]
        if bound is not None and name != "oracle":
            gap = _cell(mean_ci95([m["cost_kwh_eq"]["per_seed"][s] - bound["metrics"]["cost_kwh_eq"]["per_seed"][s]
                                   for s in seeds]), ".4f")
        elif name != "oracle" and "upper_cost_kwh_eq" in m:
            gap = _cell(mean_ci95([m["cost_kwh_eq"]["per_seed"][s] - m["upper_cost_kwh_eq"]["per_seed"][s]
                                   for s in seeds]), ".4f")
        else:
            gap = "0" if name == "oracle" else "n/a"
        dev = _cell(m["mean_abs_dev_pct"], ".2f") if "mean_abs_dev_pct" in m else "energy-only"  # (no commitment)
        score = _cell(m["score"], ".2f") if "score" in m else "-"
        delay = _cell(m["planning_delay_s_mean"], ".2f") if "planning_delay_s_mean" in m else "-"
        lines.append(f"| {name} | {score} | {_cell(m['cost_kwh_eq'], '.4f')} | {dev} | "
                     f"{_cell(m['attainment_pct'], '.3f')} | {_cell(m['misses'], '.1f')} | "
                     f"{_cell(mean_ci95(total), '.4f')} | {gap} | {c['slo_gate_pass_count']}/{c['episodes']} | "
                     f"{delay} |")
    return "\n".join(lines)


def merged(dirs: list[Path]) -> dict:
    """One compare.json document of one scenario from several ``compare --out`` folders (per-seed runs of the same
    controllers), re-aggregated from their episodes' summary.json files."""
    from commitenv.runner import aggregate

    scenario, controllers, episodes = None, {}, {}
    for d in dirs:
        doc = json.loads((d / "compare.json").read_text())
        if scenario not in (None, doc["scenario"]):
            raise SystemExit(f"--merge: {d} is {doc['scenario']}, not {scenario}")
        scenario = doc["scenario"]
        for c in doc["controllers"]:
            controllers.setdefault(c["controller"], c)
            for seed in c["seeds"]:
                path = d / c["controller"] / f"seed-{seed}" / "summary.json"
                episodes.setdefault(c["controller"], {})[seed] = json.loads(path.read_text())
    seeds = sorted({s for runs in episodes.values() for s in runs})
    return aggregate(scenario, seeds, list(controllers.values()), episodes, [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("compare_json", nargs="+", type=Path, help="compare.json files (with --merge: compare --out folders)")
    ap.add_argument("--merge", action="store_true", help="one table of the folders' per-seed runs of one scenario")
    ap.add_argument("--penalty-kwh", type=float, default=0.015, help="miss penalty of the scenarios (kWh-eq)")
    args = ap.parse_args(argv)
    if not (args.penalty_kwh >= 0 and math.isfinite(args.penalty_kwh)):
        ap.error("--penalty-kwh: expected a finite value >= 0")
    docs = [merged(args.compare_json)] if args.merge else [json.loads(p.read_text()) for p in args.compare_json]
    for doc in docs:
        print(table(doc, args.penalty_kwh))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
