"""What every benchmark prints beside its figures: ../shared/tools/machine_factor.py's speed factor of this machine
(1.0 = the reference machine; machines here differ ~3x), or None where ../shared is not beside the checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def machine_factor() -> float | None:
    tool = Path(__file__).resolve().parents[2] / "shared" / "tools" / "machine_factor.py"
    if not tool.is_file():
        return None
    out = subprocess.run([sys.executable, str(tool)], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())
