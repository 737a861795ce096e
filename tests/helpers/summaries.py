"""Comparing run summaries without what depends on the machine's speed."""

from __future__ import annotations

TIMING_KEYS = {"wall_s"}  # wall-clock measures, which differ run to run


def per_seed(doc: dict) -> dict:
    """Each controller's per-seed metrics of a comparison document, timings left out."""
    return {c["controller"]: {k: m["per_seed"] for k, m in c["metrics"].items() if k not in TIMING_KEYS}
            for c in doc["controllers"]}
