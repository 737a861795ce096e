"""Where shipped data files (profiles, scenarios) live, in a wheel install and in a source checkout."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_dir(kind: str) -> Path:
    """Folder of shipped ``kind`` files ('profiles' or 'scenarios'): wheel copy first, then the checkout."""
    for cand in (_PKG / "_data" / kind, _PKG.parent / kind):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"no shipped '{kind}' folder found next to {_PKG}")
