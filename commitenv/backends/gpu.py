"""The GPU seam: what a backend needs of a device (supported clocks, lock and reset, the energy counter, throttle
reasons), with NVML's error kinds, and `LockedClocks`, which resets a locked clock on every way out.

Implementations: `commitenv.backends.nvml.NvmlGpu` (nvidia-ml-py) and `commitenv.backends.fake_gpu.FakeGpu` (the
profile's power on a virtual clock). The same contract tests (tests/backends/test_backend_contracts.py) run on both.
"""

from __future__ import annotations

import atexit
import signal
from abc import ABC, abstractmethod
from types import FrameType
from typing import Any


class GpuError(RuntimeError):
    """A device call failed (NVML's NVMLError)."""


class GpuPermissionError(GpuError):
    """The call needs privileges this process lacks (NVML_ERROR_NO_PERMISSION): locking clocks needs root or
    ``nvidia-smi -acp UNRESTRICTED``."""


class GpuInvalidArgument(GpuError):
    """An argument the device refuses (NVML_ERROR_INVALID_ARGUMENT), e.g. an unsupported clock."""


class GpuControl(ABC):
    """One GPU as a backend drives it."""

    index: int
    name: str
    energy_update_s: float  # how often the energy counter advances (NVML: 20-100 ms depending on the part)

    @abstractmethod
    def supported_clocks_mhz(self) -> list[int]:
        """Graphics clocks the device can be locked to, ascending."""

    @abstractmethod
    def lock_clock(self, mhz: int) -> None:
        """Lock the graphics clock to ``mhz`` (one of `supported_clocks_mhz`); GpuInvalidArgument otherwise,
        GpuPermissionError without the privilege."""

    @abstractmethod
    def reset_clock(self) -> None:
        """Undo `lock_clock` (the driver's default clock policy again)."""

    @abstractmethod
    def energy_mj(self) -> int:
        """The device's total energy counter, mJ since the driver loaded (monotone, updated every
        ``energy_update_s``)."""

    @abstractmethod
    def throttle_reasons(self) -> int:
        """NVML's clock-throttle reason bit mask (0: none)."""

    @abstractmethod
    def current_clock_mhz(self) -> int:
        """The graphics clock the device runs at now (a lock shows here once it took effect)."""


class LockedClocks:
    """Context manager that resets every GPU whose clock a backend locked, on exit, on an exception, at
    interpreter exit and on SIGINT/SIGTERM (the previous handler runs afterwards)."""

    def __init__(self, gpus: list[GpuControl]) -> None:
        self.gpus = list(gpus)
        self._previous: dict[int, Any] = {}
        self._active = False

    def reset_all(self) -> None:
        errors = []
        for g in self.gpus:
            try:
                g.reset_clock()
            except GpuError as e:  # keep resetting the others; report at the end
                errors.append(f"GPU {g.index}: {e}")
        if errors:
            raise GpuError("could not reset locked clocks: " + "; ".join(errors))

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._exit()
        prev = self._previous.get(signum)
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    def _exit(self) -> None:
        if self._active:
            self._active = False
            self.reset_all()

    def __enter__(self) -> "LockedClocks":
        self._active = True
        atexit.register(self._exit)
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[s] = signal.signal(s, self._on_signal)
            except ValueError:  # not the main thread: atexit and __exit__ still reset
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._exit()
        finally:
            atexit.unregister(self._exit)
            for s, prev in self._previous.items():
                signal.signal(s, prev)
            self._previous.clear()
