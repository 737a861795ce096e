"""Real-GPU check of the NVML backend (`commitenv.backends.nvml.NvmlGpu`) on one GPU: its name, supported clocks,
the energy counter's update period (measure_energy_update_s against the ENERGY_UPDATE_S bound), whether clocks can
be locked, and the power drawn idle and under a bf16 matrix-product load at each lockable profile clock (energy
counter delta over wall time). Needs nvidia-ml-py and torch with a GPU; imports only commitenv.backends' gpu and
nvml modules (no other dependency of commitenv), so it runs in a bare GPU image:

    python benchmarks/device_nvml_check.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for name, sub in (("commitenv", "commitenv"), ("commitenv.backends", "commitenv/backends")):
    if name not in sys.modules:  # the two modules alone, without the package's scenario registry
        mod = types.ModuleType(name)
        mod.__path__ = [str(ROOT / sub)]
        sys.modules[name] = mod

from commitenv.backends.gpu import GpuError  # noqa: E402
from commitenv.backends.nvml import ENERGY_UPDATE_S, NvmlGpu, measure_energy_update_s  # noqa: E402

PROFILE_CLOCKS = [345, 690, 1035, 1380, 1710, 1980]  # the shipped H200 profile's levels and the part's maximum


def power_w(gpu: NvmlGpu, seconds: float, work=None) -> tuple[float, int]:
    """Mean power over ``seconds`` from the energy counter (mJ), running ``work()`` in a loop if given; the clock at
    the end."""
    e0, t0 = gpu.energy_mj(), time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        if work is None:
            time.sleep(0.05)
        else:
            work()
            n += 1
    e1, t1 = gpu.energy_mj(), time.monotonic()
    return (e1 - e0) / 1000.0 / (t1 - t0), gpu.current_clock_mhz()


def main() -> int:
    import torch

    out: dict = {}
    with NvmlGpu(0) as gpu:
        out["name"] = gpu.name
        levels = gpu.supported_clocks_mhz()
        out["supported_clocks_mhz"] = {"n": len(levels), "min": levels[0], "max": levels[-1],
                                       "profile_levels_supported": {c: c in levels for c in PROFILE_CLOCKS}}
        out["energy_update_s"] = [round(measure_energy_update_s(gpu), 4) for _ in range(5)]
        out["energy_update_bound_s"] = ENERGY_UPDATE_S
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

        def work() -> None:
            for _ in range(10):
                a @ b
            torch.cuda.synchronize()

        work()
        rows = []
        for c in PROFILE_CLOCKS:
            row: dict = {"clock_mhz": c}
            try:
                gpu.lock_clock(c)
                row["locked"] = True
            except GpuError as e:
                row["locked"] = False
                row["error"] = f"{type(e).__name__}: {e}"[:200]
            time.sleep(1.0)
            row["idle_w"], row["idle_clock_mhz"] = power_w(gpu, 3.0)
            row["load_w"], row["load_clock_mhz"] = power_w(gpu, 4.0, work)
            torch.cuda.synchronize()
            rows.append(row)
            print(json.dumps(row), flush=True)
            if not row["locked"]:
                break  # (no lock: one unlocked measurement is all this machine allows)
        try:
            gpu.reset_clock()
        except GpuError as e:
            out["reset_error"] = str(e)[:200]
        out["by_clock"] = rows
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "by_clock"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
