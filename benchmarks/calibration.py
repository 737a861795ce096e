"""Profile calibration check: hourly full-capacity vLLM energy (32 replicas, all active, reference clock) on
azure-code-day against the ePACT paper's implied hourly references (epact_day_hourly.csv columns
h20_reference_vllm_mj and h200_reference_vllm_mj). Prints one JSON object as its last line."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

from commitenv.profiles import load_profile
from commitenv.sim import EngineOptions
from commitenv.sim.fixed import run_fixed
from commitenv.workload import builtin_workload

DEFAULT_CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "paper" / "epact_day_hourly.csv"
PAIRS = {"h20": ("h20-qwen3.8-27b-fp8", "h20_reference_vllm_mj"), "h200": ("h200-qwen3.8-27b-fp8", "h200_reference_vllm_mj")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not args.csv.exists():
        sys.exit(f"reference table not found: {args.csv} (pass --csv)")
    rows = list(csv.DictReader(args.csv.open()))
    table = builtin_workload("azure-code-day", seed=args.seed)
    out: dict[str, object] = {"seed": args.seed}
    for gpu, (prof_name, col) in PAIRS.items():
        ref = np.array([float(r[col]) for r in rows])
        prof = load_profile(prof_name)
        res = run_fixed(prof, table, n_gpus=32, options=EngineOptions(seed=args.seed))
        sim = res.hourly_energy_j / 1e6
        err = 100 * (sim - ref) / ref
        print(f"{gpu}: {prof_name}")
        print(f"{'hour':>4} {'arrivals':>9} {'sim_MJ':>8} {'ref_MJ':>8} {'err_%':>7}")
        for h in range(len(ref)):
            print(f"{h:>4} {int(res.hourly_arrivals[h]):>9} {sim[h]:>8.3f} {ref[h]:>8.3f} {err[h]:>7.2f}")
        day = 100 * (sim.sum() - ref.sum()) / ref.sum()
        print(f"day: sim {sim.sum():.2f} MJ ref {ref.sum():.2f} MJ err {day:.2f} %  attainment {100 * res.attainment:.2f} %")
        out[gpu] = {
            "profile": prof_name,
            "max_abs_hour_err_pct": round(float(np.max(np.abs(err))), 3),
            "day_err_pct": round(float(day), 3),
            "day_energy_mj": round(float(sim.sum()), 3),
            "ref_day_energy_mj": round(float(ref.sum()), 3),
            "attainment_pct": round(100 * res.attainment, 3),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
