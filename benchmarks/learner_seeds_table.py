"""Learned controllers over learner seeds: one markdown row per learner seed (mean ± 95 % t half-width over the test
seeds of `commitenv compare`) and one row per recipe (mean ± 95 % t half-width of the learner seeds' means).

    python benchmarks/learner_seeds_table.py RECIPE=CTRL1,CTRL2,CTRL3 [RECIPE=...] --compare A/compare.json [B/...]

CTRL is a controller name as compare.json records it (``sb3-<folder>``)."""

from __future__ import annotations

import argparse
import json

import numpy as np
from scipy import stats

COLS = ("score", "cost_kwh_eq", "attainment_pct", "misses", "mean_abs_dev_pct")


def ci(x: list[float]) -> tuple[float, float]:
    a = np.asarray(x, dtype=float)
    if len(a) < 2:
        return float(a.mean()), float("nan")
    return float(a.mean()), float(stats.t.ppf(0.975, len(a) - 1) * a.std(ddof=1) / np.sqrt(len(a)))


def fmt(m: float, h: float, col: str) -> str:
    d = 4 if col == "cost_kwh_eq" else (3 if col == "attainment_pct" else (1 if col == "misses" else 2))
    return f"{m:.{d}f} ± {h:.{d}f}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("recipes", nargs="+")
    p.add_argument("--compare", nargs="+", required=True)
    a = p.parse_args()
    rows = {}
    for f in a.compare:
        for c in json.load(open(f))["controllers"]:
            rows[c["controller"]] = c
    print("| controller | learner seed | " + " | ".join(COLS) + " | SLO gate |")
    print("|---" * (len(COLS) + 3) + "|")
    for rec in a.recipes:
        name, _, ctrls = rec.rpartition("=")
        means = {k: [] for k in COLS}
        gates, n = 0, 0
        for i, c in enumerate(ctrls.split(",")):
            r = rows[c]
            cells = []
            for k in COLS:
                per = list(r["metrics"][k]["per_seed"].values())
                m, h = ci(per)
                means[k].append(m)
                cells.append(fmt(m, h, k))
            gates += r["slo_gate_pass_count"]
            n += r["episodes"]
            print(f"| {c} | {i} | " + " | ".join(cells) + f" | {r['slo_gate_pass_count']}/{r['episodes']} |")
        if len(ctrls.split(",")) < 2:
            continue
        print(f"| **{name}** (mean over learner seeds) | all | "
              + " | ".join(f"**{fmt(*ci(means[k]), k)}**" for k in COLS) + f" | {gates}/{n} |")


if __name__ == "__main__":
    main()
