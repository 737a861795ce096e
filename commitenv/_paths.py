"""Where shipped data files (profiles, scenarios) and the built-in controllers' package live, in a wheel install
and in a source checkout."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_dir(kind: str) -> Path:
    """Folder of shipped ``kind`` files ('profiles', 'scenarios' or 'sites'): wheel copy first, then the checkout."""
    for cand in (_PKG / "_data" / kind, _PKG.parent / kind):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"no shipped '{kind}' folder found next to {_PKG}")


def package_dir(name: str) -> Path:
    """Folder of the installed package ``name`` (such as the built-in controllers, ``commitenv_controllers``),
    found by name without importing it: the library reads the plug-ins' files but never imports them."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no package '{name}' is installed (pip install commitenv installs the built-in "
                                  "controllers)", name=name)
    return Path(spec.origin).parent
