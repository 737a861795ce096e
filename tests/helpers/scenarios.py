"""Small scenarios written into a temporary folder: the toy profile, hand-made Azure-format traces, absolute
commitments and 600 s intervals (an hour is 6 steps); and the shipped hour most env-level tests run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from helpers.profiles import COLOCATE, toy_profile

HOUR_SCENARIO = "epact-h200-hour-fixed-a30"  # shipped, 60 steps, about 0.4 s per episode
_BASE_TIME = np.datetime64("2023-11-16T18:00:00", "ns")


def write_trace(path: Path, arrival_s, prompt, output) -> Path:
    """An Azure-format trace (``TIMESTAMP,ContextTokens,GeneratedTokens``, 7 fractional digits); the loader
    rebases times to the first row, so ``arrival_s[0]`` should be 0."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t, p, o in zip(arrival_s, prompt, output):
        ns = _BASE_TIME + np.timedelta64(int(round(float(t) * 1e7)) * 100, "ns")
        s = str(ns).replace("T", " ")  # 2023-11-16 18:00:29.575801800
        lines.append(f"{s[:27]},{int(p)},{int(o)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_toy_profile(folder: Path) -> Path:
    path = folder / "toy-profile.yaml"
    if not path.exists():
        path.write_text(yaml.safe_dump(toy_profile().model_dump(mode="json")))
    return path


def write_scenario(folder: Path, name: str, **fields) -> Path:
    """A scenario YAML in ``folder``; ``fields`` override the toy defaults (2 toy GPUs, 600 s intervals)."""
    folder.mkdir(parents=True, exist_ok=True)
    raw = {
        "name": name,
        "description": f"test scenario {name}",
        "pool": {"profile": str(write_toy_profile(folder)), "gpus": 2},
        "interval_s": 600,
        "realism": "ideal",  # the exact engine: these tests compute their expectations by hand
    }
    raw.update(fields)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def toy_three_hour_trace(path: Path) -> Path:
    """300 small requests over three hours, plus: one arriving just before the first hour ends (it finishes
    in hour 1), one whose prompt exceeds the toy context limit (rejected), and one in the last minute."""
    rng = np.random.default_rng(7)
    t = np.sort(rng.uniform(1.0, 3 * 3600 - 60, 297))
    t = np.concatenate([[0.0], t, [3599.99, 5000.0, 3 * 3600 - 5.0]])
    order = np.argsort(t, kind="stable")
    p = np.concatenate([rng.integers(4, 24, 298), [10, 70], [6]])
    o = np.concatenate([rng.integers(1, 24, 298), [30, 5], [4]])
    return write_trace(path, t[order], p[order], o[order])


def toy_three_hour(folder: Path, **fields) -> Path:
    """Three hours, commitments 0.2 / 0.5 / 0.3 MJ (a 2-GPU toy pool draws about 0.36 MJ an hour at the top
    clock: hours 0 and 2 overuse, hour 1 underuses), lambda_plus 3, lambda_minus 0.5."""
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / "toy3.csv"
    if not trace.exists():
        toy_three_hour_trace(trace)
    name = fields.pop("name", "toy-three")
    base = dict(workload={"trace": str(trace)}, horizon_hours=3, commitment={"mj": [0.2, 0.5, 0.3]},
                lambda_plus=3.0, lambda_minus=0.5)
    base.update(fields)
    return write_scenario(folder, name, **base)


def toy_miss(folder: Path, **fields) -> Path:
    """Two hours with bursts of 20 simultaneous requests, SLO scale 1.5 and a miss penalty, so one replica at
    the low clock misses deadlines."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    t = np.sort(np.concatenate([[0.0], rng.uniform(1, 7000, 40), np.full(20, 100.0), np.full(20, 4000.0), [7190.0]]))
    trace = write_trace(folder / "miss.csv", t, rng.integers(4, 30, len(t)), rng.integers(2, 30, len(t)))
    base = dict(workload={"trace": str(trace)}, horizon_hours=2, alpha=1.5, commitment={"mj": [0.2]},
                miss_penalty_kwh=0.01)
    base.update(fields)
    return write_scenario(folder, "toy-miss", **base)


def write_shared_profiles(folder: Path) -> tuple[Path, Path]:
    """Two toy models on the same toy GPU: 'big' takes twice the toy law's time and energy per token."""
    a = folder / "toy-small.yaml"
    b = folder / "toy-big.yaml"
    small = toy_profile(scheduler=COLOCATE)
    big = toy_profile(name="toy-big", scheduler=COLOCATE)
    clocks = []
    for c in big.model_dump(mode="json")["clocks"]:
        c["time"] = {k: 2 * v for k, v in c["time"].items()}
        c["energy"] = {k: 2 * v for k, v in c["energy"].items()}
        clocks.append(c)
    a.write_text(yaml.safe_dump(small.model_dump(mode="json")))
    b.write_text(yaml.safe_dump({**big.model_dump(mode="json"), "clocks": clocks}))
    return a, b


def shared_scenario(folder: Path, name: str = "toy-shared", **over) -> Path:
    """Two toy models ('small', 'big') sharing three GPUs by SM share, one hour of the toy trace."""
    folder.mkdir(parents=True, exist_ok=True)
    a, b = write_shared_profiles(folder)
    trace = folder / "toy3.csv"
    if not trace.exists():
        toy_three_hour_trace(trace)
    raw = {
        "name": name,
        "description": "two toy models sharing three GPUs",
        "pool": {
            "gpus": 3,
            "models": [{"name": "small", "profile": str(a), "tenants": ["s"]},
                       {"name": "big", "profile": str(b), "tenants": ["b"]}],
            "placement": [[{"model": "small", "share": 0.5}, {"model": "big", "share": 0.5}],
                          [{"model": "small", "share": 1.0}],
                          [{"model": "big", "share": 0.6}, {"model": "small", "share": 0.4}]],
        },
        "workload": {"trace": str(trace), "tenant_mix": {"s": 0.7, "b": 0.3}},
        "horizon_hours": 1,
        "interval_s": 600,
        "commitment": {"mj": [0.2]},
        "realism": "ideal",
    }
    for k, v in over.items():
        raw[k] = v
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path
