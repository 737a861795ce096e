"""The cost of the leaderboard's kernel boundary: the dev suite's episodes scored in the sandbox with the kernel
isolation (bubblewrap namespaces, seccomp, rlimits) and with the plain-process one, alternately in the same run, per
episode; and the start-up alone (a controller built once, as `validate_submission` does). Prints JSON: per episode
both wall times and their difference, the means, and the machine factor of ../shared/tools/machine_factor.py.

    python benchmarks/bench_sandbox.py [--submission leaderboard/submissions/vllm] [--suite dev] [--episodes 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from machine import machine_factor  # benchmarks/machine.py (run as python benchmarks/NAME.py)

from commitenv.leaderboard.sandbox import SandboxJob, run_sandboxed, validate_submission
from commitenv.leaderboard.submission import load_submission
from commitenv.leaderboard.suite import episodes, load_suite


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--submission", default="leaderboard/submissions/vllm")
    ap.add_argument("--suite", default="dev")
    ap.add_argument("--episodes", type=int, default=6, help="the suite's first N episodes")
    ap.add_argument("--startups", type=int, default=10, help="start-ups to time per isolation")
    a = ap.parse_args()
    sub = load_submission(Path(a.submission))
    suite, h = load_suite(a.suite, Path("leaderboard"))
    eps = episodes(suite, h)[: a.episodes]
    rows = []
    for ep in eps:
        row = {"episode": ep.label}
        for iso in ("process", "kernel") if len(rows) % 2 == 0 else ("kernel", "process"):  # alternate the order
            t0 = time.perf_counter()
            out = run_sandboxed(SandboxJob(sub, ep, suite.limits, (), ep.controller_seed, iso))
            row[iso] = {"wall_s": round(time.perf_counter() - t0, 3), "status": out.get("status"),
                        "cost_kwh_eq": out["summary"]["cost_kwh_eq"]}
        row["overhead_s"] = round(row["kernel"]["wall_s"] - row["process"]["wall_s"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    startup = {}
    for iso in ("process", "kernel"):
        walls = []
        for _ in range(a.startups):
            t0 = time.perf_counter()
            validate_submission(sub, suite.limits, (), iso)
            walls.append(time.perf_counter() - t0)
        startup[iso] = round(statistics.median(walls), 3)
    print(json.dumps({
        "submission": sub.name, "suite": suite.name, "episodes": len(rows),
        "mean_wall_s": {iso: round(statistics.mean(r[iso]["wall_s"] for r in rows), 3) for iso in ("process", "kernel")},
        "mean_overhead_s_per_episode": round(statistics.mean(r["overhead_s"] for r in rows), 3),
        "same_costs": all(r["kernel"]["cost_kwh_eq"] == r["process"]["cost_kwh_eq"] for r in rows),
        "startup_median_s": startup, "machine_factor": machine_factor(),
    }))


if __name__ == "__main__":
    main()
