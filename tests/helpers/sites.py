"""Small sites written into a temporary folder: pools of the toy three-hour scenario behind one meter."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_site(folder: Path, pools: list[dict], **fields) -> Path:
    """A site YAML ``toy-site.yaml`` in ``folder`` with ``pools`` and the other fields given."""
    raw = {"name": "toy-site", "description": "test site", "pools": pools, **fields}
    path = folder / "toy-site.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def three_pools(folder: Path, toy: Path, **fields) -> Path:
    """Pools a (the toy scenario), b (other commitments: 0.4 / 0.1 / 0.3 MJ) and c (one GPU) of the toy scenario."""
    return write_site(folder, [
        {"name": "a", "scenario": str(toy)},
        {"name": "b", "scenario": str(toy), "overrides": {"commitment": {"mj": [0.4, 0.1, 0.3]}}},
        {"name": "c", "scenario": str(toy), "overrides": {"pool": {"gpus": 1}}},
    ], **fields)


def actions_for(k: int) -> dict:
    """A fixed, varied schedule (the toy profile has two clocks): pool a alternates 1/2 replicas and its clock, b
    runs 2 at the low clock, c 1 at the top."""
    return {"a": {"active": 1 + k % 2, "clock": (k // 2) % 2}, "b": {"active": 2, "clock": 0},
            "c": {"active": 1, "clock": 1}}
