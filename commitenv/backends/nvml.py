"""`NvmlGpu`: the `GpuControl` seam over NVML (package nvidia-ml-py, module ``pynvml``) for one real GPU.

``pynvml`` is imported when a GPU is opened, not with this module, so the package imports on machines without it;
opening one there raises ImportError naming the ``gpu`` extra. NVML errors become the seam's error kinds
(`GpuPermissionError`, `GpuInvalidArgument`, `GpuError`), each naming the GPU index and the NVML call.

Energy counter: NVML documents ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded) for Volta and
newer; its update period is not in NVML's reference. Third-party measurements put it at 20-100 ms (PETSc's manual
page for PetscLogGpuEnergyMeter: "for newer GPUs, energy readings are updated every 20-100ms"; the ML.ENERGY /
Zeus blog "Thermally Stable Profiling for Accurate GPU Energy Measurement": "approximately every 100 ms"). So
`ENERGY_UPDATE_S` is the conservative 0.1 s; `measure_energy_update_s` measures the actual period on a device.
"""

from __future__ import annotations

import threading
import time
from types import ModuleType
from typing import Any, Callable

from commitenv.backends.gpu import GpuControl, GpuError, GpuInvalidArgument, GpuPermissionError

ENERGY_UPDATE_S = 0.1  # see the module docstring: not documented by NVML; 20-100 ms measured by others, take the top

_INSTALL_HINT = 'nvidia-ml-py is not installed: pip install "commitenv[gpu]"'
_PERMISSION_HINT = "locking clocks needs root or `nvidia-smi -acp UNRESTRICTED`"

_lock = threading.Lock()
_refs = 0  # NvmlGpu instances holding an nvmlInit; nvmlShutdown when the last one closes


def _import_pynvml() -> ModuleType:
    """The ``pynvml`` module, or ImportError naming the extra that installs it."""
    try:
        import pynvml
    except ImportError as e:
        raise ImportError(_INSTALL_HINT) from e
    return pynvml


def _acquire(nv: ModuleType) -> None:
    """nvmlInit once per process (refcounted across instances)."""
    global _refs
    with _lock:
        if _refs == 0:
            nv.nvmlInit()
        _refs += 1


def _release(nv: ModuleType) -> None:
    """Drop one reference; nvmlShutdown with the last."""
    global _refs
    with _lock:
        if _refs <= 0:
            return
        _refs -= 1
        if _refs == 0:
            nv.nvmlShutdown()


def _map_error(nv: ModuleType, index: int, call: str, e: Exception) -> GpuError:
    """The seam's error for NVML error ``e`` raised by ``call`` on GPU ``index``."""
    code = getattr(e, "value", None)

    def is_(name: str) -> bool:
        v = getattr(nv, name, None)
        return v is not None and code == v

    msg = f"GPU {index}: {call}: {e} (NVML error {code})"
    if is_("NVML_ERROR_NO_PERMISSION"):
        return GpuPermissionError(f"{msg}; {_PERMISSION_HINT}")
    if is_("NVML_ERROR_INVALID_ARGUMENT") or is_("NVML_ERROR_NOT_SUPPORTED") or is_("NVML_ERROR_FREQ_NOT_SUPPORTED"):
        return GpuInvalidArgument(msg)
    return GpuError(msg)


class NvmlGpu(GpuControl):
    """GPU ``index`` (NVML's enumeration order, which is PCI bus order, not necessarily CUDA's default order) driven
    through NVML. `close` (or ``with``) releases this instance's nvmlInit."""

    def __init__(self, index: int) -> None:
        self.index = int(index)
        self._nv = _import_pynvml()
        self._open = False
        try:
            _acquire(self._nv)
        except self._nv.NVMLError as e:
            raise _map_error(self._nv, self.index, "nvmlInit", e) from e
        self._open = True
        try:
            self._handle = self._call("nvmlDeviceGetHandleByIndex", self.index)
            name = self._call("nvmlDeviceGetName", self._handle)
        except BaseException:
            self.close()
            raise
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.energy_update_s = ENERGY_UPDATE_S
        self._supported: list[int] | None = None

    # ------------------------------------------------------------------------------------------------- helpers
    def _call(self, fn: str, *args: Any) -> Any:
        """``pynvml.<fn>(*args)`` with its NVMLError mapped to the seam's kinds."""
        if not self._open:
            raise GpuError(f"GPU {self.index}: {fn}: the NvmlGpu is closed")
        f: Callable[..., Any] = getattr(self._nv, fn)
        try:
            return f(*args)
        except self._nv.NVMLError as e:
            raise _map_error(self._nv, self.index, fn, e) from e

    # --------------------------------------------------------------------------------------------- GpuControl
    def supported_clocks_mhz(self) -> list[int]:
        """Graphics clocks supported at the highest supported memory clock, ascending, deduplicated (cached)."""
        if self._supported is None:
            mem = self._call("nvmlDeviceGetSupportedMemoryClocks", self._handle)
            if not mem:
                raise GpuInvalidArgument(f"GPU {self.index}: nvmlDeviceGetSupportedMemoryClocks: no memory clocks")
            gfx = self._call("nvmlDeviceGetSupportedGraphicsClocks", self._handle, max(mem))
            self._supported = sorted({int(c) for c in gfx})
        return list(self._supported)

    def lock_clock(self, mhz: int) -> None:
        """Lock min and max graphics clock to ``mhz``, after checking it is supported (no NVML call otherwise)."""
        levels = self.supported_clocks_mhz()
        if int(mhz) != mhz or int(mhz) not in levels:
            raise GpuInvalidArgument(f"GPU {self.index}: nvmlDeviceSetGpuLockedClocks: {mhz} MHz is not a supported "
                                     f"clock; supported: {levels}")
        self._call("nvmlDeviceSetGpuLockedClocks", self._handle, int(mhz), int(mhz))

    def reset_clock(self) -> None:
        self._call("nvmlDeviceResetGpuLockedClocks", self._handle)

    def energy_mj(self) -> int:
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption", self._handle))

    def throttle_reasons(self) -> int:
        """The clock event (throttle) reason mask: newer NVML names the call ...ClocksEventReasons and deprecates
        ...ClocksThrottleReasons; older bindings have only the latter."""
        if hasattr(self._nv, "nvmlDeviceGetCurrentClocksEventReasons"):
            return int(self._call("nvmlDeviceGetCurrentClocksEventReasons", self._handle))
        return int(self._call("nvmlDeviceGetCurrentClocksThrottleReasons", self._handle))

    def current_clock_mhz(self) -> int:
        """The graphics clock now (a lock shows here once it took effect)."""
        return int(self._call("nvmlDeviceGetClockInfo", self._handle, self._nv.NVML_CLOCK_GRAPHICS))

    # ------------------------------------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Release this instance's nvmlInit (nvmlShutdown with the last one); idempotent."""
        if self._open:
            self._open = False
            try:
                _release(self._nv)
            except self._nv.NVMLError as e:
                raise _map_error(self._nv, self.index, "nvmlShutdown", e) from e

    def __enter__(self) -> "NvmlGpu":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measure_energy_update_s(gpu: GpuControl, *, timeout_s: float = 2.0, poll_s: float = 0.001,
                            clock: Callable[[], float] = time.monotonic,
                            sleep: Callable[[float], None] = time.sleep) -> float:
    """Measure how often ``gpu``'s energy counter advances: poll it until it changes twice and return the time
    between the two changes (the first change only aligns the start). TimeoutError after ``timeout_s``."""
    t_end = clock() + timeout_s
    last = gpu.energy_mj()
    changes: list[float] = []
    while len(changes) < 2:
        if clock() > t_end:
            raise TimeoutError(f"GPU {gpu.index}: energy counter changed {len(changes)} time(s) in {timeout_s} s")
        sleep(poll_s)
        e = gpu.energy_mj()
        if e != last:
            changes.append(clock())
            last = e
    return changes[1] - changes[0]
