"""Real GPU pools: the seams a hardware backend drives (`gpu.GpuControl`, `engine.ServingEngine`, `clock.Clock`),
their implementations on NVML (`nvml`) and vLLM (`vllm_engine`), faithful CPU fakes (`fake_gpu`, `fake_engine`) that
the same contract tests run against, and `calibrate`, which measures a GPU x model into a profile."""

from commitenv.backends.clock import Clock, VirtualClock, WallClock
from commitenv.backends.engine import ServingEngine, StepRecord
from commitenv.backends.gpu import GpuControl, GpuError, GpuInvalidArgument, GpuPermissionError, LockedClocks

__all__ = ["Clock", "GpuControl", "GpuError", "GpuInvalidArgument", "GpuPermissionError", "LockedClocks",
           "ServingEngine", "StepRecord", "VirtualClock", "WallClock"]
