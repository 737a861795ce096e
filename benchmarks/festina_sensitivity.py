"""How much the shared-GPU results depend on the assumed SM-share scaling: festina-h100-shared with the profiles'
``sm_share.memory_exponent`` (decode time ~ share^-e; assumed 0.4) and ``compute_exponent`` (prefill, assumed 1.0)
varied, the MuxServe-like default (``vllm``) and ``festina`` on one test seed each. Prints energy, TTFT/TBT attainment
and Festina's saving per setting, then a JSON line.

    python benchmarks/festina_sensitivity.py [--seed 100000] [--memory 0.2,0.4,0.6] [--compute 0.8,1.0]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import yaml

from commitenv._paths import data_dir
from commitenv.evaluation import run_episode
from commitenv.profiles import load_profile
from commitenv.scenarios import load_scenario

from machine import machine_factor


def variant(folder: Path, memory: float, compute: float) -> Path:
    """festina-h100-shared with every model's SM-share exponents replaced (profile copies in ``folder``)."""
    raw = yaml.safe_load((data_dir("scenarios") / "festina-h100-shared.yaml").read_text())
    for m in raw["pool"]["models"]:
        prof = load_profile(m["profile"]).model_dump(mode="json")
        prof["sm_share"].update(memory_exponent=memory, compute_exponent=compute)
        prof["name"] = f"{prof['name']}-m{memory}-c{compute}"
        path = folder / f"{prof['name']}.yaml"
        path.write_text(yaml.safe_dump(prof))
        m["profile"] = str(path)
    raw["name"] = f"festina-h100-shared-m{memory}-c{compute}".replace("_", "-")
    out = folder / f"{raw['name']}.yaml"
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    load_scenario(out)  # validate
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=100000)
    ap.add_argument("--memory", default="0.2,0.4,0.6")
    ap.add_argument("--compute", default="1.0")
    args = ap.parse_args()
    factor = machine_factor()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for c in (float(x) for x in args.compute.split(",")):
            for m in (float(x) for x in args.memory.split(",")):
                path = variant(Path(tmp), m, c)
                res = {name: run_episode(name, str(path), args.seed)[1].summary for name in ("vllm", "festina")}
                row = {"memory_exponent": m, "compute_exponent": c,
                       **{f"{n}_{k}": res[n][k] for n in res for k in ("energy_mj", "latency_attainment_pct",
                                                                       "attainment_pct", "wall_s")}}
                row["festina_saving_pct"] = 100 * (1 - row["festina_energy_mj"] / row["vllm_energy_mj"])
                rows.append(row)
                print(f"memory {m} compute {c}: vllm {row['vllm_energy_mj']:.2f} MJ / TTFT+TBT "
                      f"{row['vllm_latency_attainment_pct']:.2f} %, festina {row['festina_energy_mj']:.2f} MJ / "
                      f"{row['festina_latency_attainment_pct']:.2f} %: saving {row['festina_saving_pct']:.1f} %")
    print(f"machine factor {factor} (1.0 = reference)")
    print(json.dumps({"machine_factor": factor, "seed": args.seed, "rows": rows}))


if __name__ == "__main__":
    main()
