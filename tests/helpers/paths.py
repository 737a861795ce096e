"""Where the repository and the shared material (papers, data, traces beside the repository) are."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (tests/helpers/paths.py)
SHARED = ROOT.parent / "shared"  # data, papers and traces beside the repository (tests that need them skip)
