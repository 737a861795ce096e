"""CPU-only checks of the real-GPU backend's glue: `NvmlGpu` over a fake ``pynvml`` (error mapping, clock checks,
the energy counter, nvmlInit refcount, the missing-package error), `LockedClocks` (reset on every way out, SIGTERM
included), and `VllmEngine`'s step accounting over a fake ``vllm`` shaped like vLLM 0.33.0's in-process engine."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from types import SimpleNamespace

import pytest

from commitenv.backends import nvml
from commitenv.backends.gpu import GpuControl, GpuError, GpuInvalidArgument, GpuPermissionError, LockedClocks

# --------------------------------------------------------------------------------------------- a fake pynvml
NO_PERMISSION, INVALID_ARGUMENT, NOT_SUPPORTED, UNKNOWN = 4, 2, 3, 999
_NAMES = {NO_PERMISSION: "Insufficient Permissions", INVALID_ARGUMENT: "Invalid Argument",
          NOT_SUPPORTED: "Not Supported", UNKNOWN: "Unknown Error"}


class FakeNVMLError(Exception):
    """Like pynvml.NVMLError: carries the NVML return code in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _NAMES.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_NoPermission(FakeNVMLError):
    pass


def make_fake_pynvml(*, mem=(1593, 2619, 2619), gfx=(1980, 345, 1980, 1200, 705), event_reasons=True):
    """A stand-in ``pynvml``: records every call in ``calls``; ``fail[fn] = code`` makes ``fn`` raise."""
    calls: list[tuple] = []
    fail: dict[str, int] = {}
    state = {"energy": 1_000}

    def rec(name, result=None):
        def fn(*args):
            calls.append((name, *args))
            if name in fail:
                code = fail[name]
                raise (NVMLError_NoPermission if code == NO_PERMISSION else FakeNVMLError)(code)
            return result(*args) if callable(result) else result
        return fn

    def graphics(handle, mem_mhz):
        return list(gfx) if mem_mhz == max(mem) else [100]

    fake = SimpleNamespace(
        NVMLError=FakeNVMLError,
        NVML_ERROR_NO_PERMISSION=NO_PERMISSION, NVML_ERROR_INVALID_ARGUMENT=INVALID_ARGUMENT,
        NVML_ERROR_NOT_SUPPORTED=NOT_SUPPORTED, NVML_ERROR_UNKNOWN=UNKNOWN, NVML_CLOCK_GRAPHICS=0,
        nvmlInit=rec("nvmlInit"), nvmlShutdown=rec("nvmlShutdown"),
        nvmlDeviceGetHandleByIndex=rec("nvmlDeviceGetHandleByIndex", lambda i: ("handle", i)),
        nvmlDeviceGetName=rec("nvmlDeviceGetName", b"NVIDIA H200"),
        nvmlDeviceGetSupportedMemoryClocks=rec("nvmlDeviceGetSupportedMemoryClocks", list(mem)),
        nvmlDeviceGetSupportedGraphicsClocks=rec("nvmlDeviceGetSupportedGraphicsClocks", graphics),
        nvmlDeviceSetGpuLockedClocks=rec("nvmlDeviceSetGpuLockedClocks"),
        nvmlDeviceResetGpuLockedClocks=rec("nvmlDeviceResetGpuLockedClocks"),
        nvmlDeviceGetTotalEnergyConsumption=rec("nvmlDeviceGetTotalEnergyConsumption", lambda h: state["energy"]),
        nvmlDeviceGetCurrentClocksThrottleReasons=rec("nvmlDeviceGetCurrentClocksThrottleReasons", 0x4),
        nvmlDeviceGetClockInfo=rec("nvmlDeviceGetClockInfo", lambda h, kind: 1980 if kind == 0 else -1),
        calls=calls, fail=fail, state=state,
    )
    if event_reasons:
        fake.nvmlDeviceGetCurrentClocksEventReasons = rec("nvmlDeviceGetCurrentClocksEventReasons", 0x20)
    return fake


def names(fake):
    return [c[0] for c in fake.calls]


@pytest.fixture
def fake(monkeypatch):
    f = make_fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", f)
    monkeypatch.setattr(nvml, "_refs", 0)
    return f


# ------------------------------------------------------------------------------------------------- NvmlGpu
def test_open_reads_handle_and_name(fake):
    g = nvml.NvmlGpu(3)
    assert (g.index, g.name) == (3, "NVIDIA H200")
    assert ("nvmlDeviceGetHandleByIndex", 3) in fake.calls
    assert g.energy_update_s == nvml.ENERGY_UPDATE_S == 0.1
    g.close()


def test_supported_clocks_sorted_dedup_at_max_memory_clock(fake):
    g = nvml.NvmlGpu(0)
    assert g.supported_clocks_mhz() == [345, 705, 1200, 1980]
    assert ("nvmlDeviceGetSupportedGraphicsClocks", ("handle", 0), 2619) in fake.calls
    g.close()


def test_lock_supported_clock_sets_min_and_max(fake):
    g = nvml.NvmlGpu(0)
    g.lock_clock(1200)
    assert fake.calls[-1] == ("nvmlDeviceSetGpuLockedClocks", ("handle", 0), 1200, 1200)
    g.reset_clock()
    assert fake.calls[-1] == ("nvmlDeviceResetGpuLockedClocks", ("handle", 0))
    assert g.current_clock_mhz() == 1980  # the graphics clock (NVML_CLOCK_GRAPHICS)
    g.close()


@pytest.mark.parametrize("mhz", [1000, 1200.5])
def test_lock_unsupported_clock_names_the_list_and_calls_nothing(fake, mhz):
    g = nvml.NvmlGpu(0)
    with pytest.raises(GpuInvalidArgument, match=r"GPU 0: .*not a supported clock; supported: \[345, 705, 1200, 1980\]"):
        g.lock_clock(mhz)
    assert "nvmlDeviceSetGpuLockedClocks" not in names(fake)
    g.close()


def test_no_permission_becomes_permission_error_with_hint(fake):
    fake.fail["nvmlDeviceSetGpuLockedClocks"] = NO_PERMISSION
    g = nvml.NvmlGpu(1)
    with pytest.raises(GpuPermissionError) as ei:
        g.lock_clock(1980)
    msg = str(ei.value)
    assert "GPU 1" in msg and "nvmlDeviceSetGpuLockedClocks" in msg and "Insufficient Permissions" in msg
    assert "root" in msg and "nvidia-smi -acp UNRESTRICTED" in msg
    assert isinstance(ei.value.__cause__, FakeNVMLError)
    g.close()


@pytest.mark.parametrize("code, kind", [(INVALID_ARGUMENT, GpuInvalidArgument), (NOT_SUPPORTED, GpuInvalidArgument),
                                        (UNKNOWN, GpuError)])
def test_other_errors_map_by_code(fake, code, kind):
    fake.fail["nvmlDeviceResetGpuLockedClocks"] = code
    g = nvml.NvmlGpu(2)
    with pytest.raises(kind, match=r"GPU 2: nvmlDeviceResetGpuLockedClocks: ") as ei:
        g.reset_clock()
    assert type(ei.value) is kind  # UNKNOWN is a plain GpuError, not a subclass
    g.close()


def test_energy_counter_passthrough(fake):
    g = nvml.NvmlGpu(0)
    assert g.energy_mj() == 1_000
    fake.state["energy"] = 123_456_789_012
    assert g.energy_mj() == 123_456_789_012
    g.close()


def test_throttle_reasons_prefers_event_reasons_then_falls_back(monkeypatch):
    monkeypatch.setattr(nvml, "_refs", 0)
    new = make_fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", new)
    with nvml.NvmlGpu(0) as g:
        assert g.throttle_reasons() == 0x20
    old = make_fake_pynvml(event_reasons=False)
    monkeypatch.setitem(sys.modules, "pynvml", old)
    with nvml.NvmlGpu(0) as g:
        assert g.throttle_reasons() == 0x4
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in names(old)


def test_init_and_shutdown_refcounted_across_instances(fake):
    a = nvml.NvmlGpu(0)
    b = nvml.NvmlGpu(1)
    assert names(fake).count("nvmlInit") == 1
    a.close()
    a.close()  # idempotent: does not release b's reference
    assert "nvmlShutdown" not in names(fake)
    b.close()
    assert names(fake).count("nvmlShutdown") == 1
    c = nvml.NvmlGpu(0)  # a later open initialises again
    assert names(fake).count("nvmlInit") == 2
    c.close()
    with pytest.raises(GpuError, match="closed"):
        c.energy_mj()


def test_failed_open_releases_its_init(fake):
    fake.fail["nvmlDeviceGetHandleByIndex"] = INVALID_ARGUMENT
    with pytest.raises(GpuInvalidArgument, match="GPU 7: nvmlDeviceGetHandleByIndex"):
        nvml.NvmlGpu(7)
    assert names(fake).count("nvmlShutdown") == 1 and nvml._refs == 0


def test_module_imports_without_pynvml_and_open_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    monkeypatch.delitem(sys.modules, "commitenv.backends.nvml")
    mod = importlib.import_module("commitenv.backends.nvml")
    with pytest.raises(ImportError, match=r'pip install "commitenv\[gpu\]"'):
        mod.NvmlGpu(0)


def test_measure_energy_update_s_times_two_changes():
    t = {"now": 0.0}

    class Stepwise:
        index = 0

        def energy_mj(self):  # advances every 50 ms, first change at 0.03 s
            return int((t["now"] + 0.02) / 0.05) * 7

    def sleep(s):
        t["now"] += s

    dt = nvml.measure_energy_update_s(Stepwise(), poll_s=0.001, clock=lambda: t["now"], sleep=sleep)
    assert dt == pytest.approx(0.05, abs=0.0015)
    with pytest.raises(TimeoutError):
        nvml.measure_energy_update_s(SimpleNamespace(index=0, energy_mj=lambda: 5), timeout_s=0.01,
                                     clock=lambda: t["now"], sleep=sleep)


# -------------------------------------------------------------------------------------------- LockedClocks
class RecordingGpu(GpuControl):
    def __init__(self, index, log, fail_reset=False):
        self.index, self.name, self.energy_update_s = index, f"stub{index}", 0.1
        self.log, self.fail_reset = log, fail_reset

    def supported_clocks_mhz(self):
        return [1000]

    def lock_clock(self, mhz):
        self.log.append(("lock", self.index, mhz))

    def reset_clock(self):
        self.log.append(("reset", self.index))
        if self.fail_reset:
            raise GpuPermissionError(f"GPU {self.index}: nvmlDeviceResetGpuLockedClocks: refused")

    def energy_mj(self):
        return 0

    def throttle_reasons(self):
        return 0

    def current_clock_mhz(self):
        return 1000


def test_locked_clocks_reset_on_normal_exit():
    log = []
    gpus = [RecordingGpu(0, log), RecordingGpu(1, log)]
    with LockedClocks(gpus):
        gpus[0].lock_clock(1000)
    assert log == [("lock", 0, 1000), ("reset", 0), ("reset", 1)]


def test_locked_clocks_reset_on_exception():
    log = []
    with pytest.raises(KeyError):
        with LockedClocks([RecordingGpu(0, log)]):
            raise KeyError("boom")
    assert log == [("reset", 0)]


def test_locked_clocks_reset_on_sigterm_then_previous_handler_runs():
    log, seen = [], []

    def previous(signum, frame):  # records and does not exit
        seen.append((signum, list(log)))

    original = signal.signal(signal.SIGTERM, previous)
    try:
        with LockedClocks([RecordingGpu(0, log), RecordingGpu(1, log)]):
            assert signal.getsignal(signal.SIGTERM) is not previous
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 5
            while not seen and time.monotonic() < deadline:
                time.sleep(0.001)
            assert seen == [(signal.SIGTERM, [("reset", 0), ("reset", 1)])]  # reset first, then the old handler
        assert log == [("reset", 0), ("reset", 1)]  # not reset twice on the way out
        assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored
    finally:
        signal.signal(signal.SIGTERM, original)


def test_locked_clocks_reset_failure_still_resets_others_and_names_it():
    log = []
    gpus = [RecordingGpu(0, log), RecordingGpu(1, log, fail_reset=True), RecordingGpu(2, log)]
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(GpuError, match=r"could not reset locked clocks: GPU 1: ") as ei:
        with LockedClocks(gpus):
            pass
    assert "GPU 0" not in str(ei.value) and "GPU 2" not in str(ei.value)
    assert log == [("reset", 0), ("reset", 1), ("reset", 2)]
    assert signal.getsignal(signal.SIGINT) is before


# ------------------------------------------------------------------------- VllmEngine over a fake vLLM
from commitenv.backends import vllm_engine  # noqa: E402  (imports without vLLM)
from helpers.reference.replica import batch_terms  # noqa: E402


def sched_out(new=(), cached=(), spec=None):
    """A SchedulerOutput as vLLM 0.33.0 shapes it: new = (id, h, c, prompt_ids), cached = (id, h, c)."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=h, prompt_token_ids=p) for r, h, _, p in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _, _ in cached],
                                              num_computed_tokens=[h for _, h, _ in cached]),
        num_scheduled_tokens={**{r: c for r, _, c, _ in new}, **{r: c for r, _, c in cached}},
        scheduled_spec_decode_tokens=spec or {},
    )


def test_scheduled_chunks_reads_tokens_before_the_step():
    out = sched_out(new=[("a", 16, 8, [0] * 40)], cached=[("b", 30, 1), ("c", 4, 6)])
    assert sorted(vllm_engine.scheduled_chunks(out)) == [("a", 8, 16), ("b", 1, 30), ("c", 6, 4)]
    with pytest.raises(RuntimeError, match="speculative"):
        vllm_engine.scheduled_chunks(sched_out(cached=[("b", 30, 1)], spec={"b": [1, 2]}))
    with pytest.raises(RuntimeError, match="num_scheduled_tokens"):
        vllm_engine.scheduled_chunks(SimpleNamespace())


@pytest.mark.parametrize("batch", [
    [(1, 10, 10, 1)],                                  # first decode after a 10-token prompt
    [(8, 0, 20, 0), (1, 23, 20, 4), (1, 19, 20, 0)],   # a first chunk, a decode, a prefill's last prompt token
    [(5, 3, 4, 2), (1, 29, 25, 5)],                    # recompute after preemption spills past the prompt; a decode
    [(1, 26, 25, 5), (1, 0, 1, 0)],                    # one recomputed token short of the end is no decode
])
def test_step_terms_agree_with_the_simulator(batch):
    """(c, h, prompt, generated): the simulator's batch_terms reads the same request state."""
    sim = [(SimpleNamespace(computed=h, prompt=p, generated=g), c) for c, h, p, g in batch]
    assert vllm_engine.step_terms(batch) == batch_terms(sim)[:4]


def test_step_terms_by_hand():
    # prefill chunk of 4 after 2 cached: A = 4*2 + 4*5/2 = 18; decode at 10 computed: L = 11
    assert vllm_engine.step_terms([(4, 2, 8, 0), (1, 10, 8, 3)]) == (4, 18, 1, 11)


class _FakeScheduler:
    """Schedules like vLLM with chunked prefill: prompts in chunks of the token budget, then one token a step."""

    def __init__(self, budget):
        self.budget, self.reqs = budget, {}

    def schedule(self, throttle=False):
        new, cached, budget = [], [], self.budget
        for rid, r in self.reqs.items():
            if budget == 0:
                break
            c = min(budget, r["prompt"] - r["h"]) if r["h"] < r["prompt"] else 1
            (new if not r["seen"] else cached).append((rid, r["h"], c) + ((list(range(r["prompt"])),) if not r["seen"] else ()))
            r["seen"], budget = True, budget - c
        out = sched_out(new=new, cached=cached)
        for rid, c in out.num_scheduled_tokens.items():
            self.reqs[rid]["h"] += c
        return out


class _FakeLLMEngine:
    """The surface VllmEngine uses of vLLM 0.33.0's LLMEngine, with internal ids suffixed as vLLM does."""

    def __init__(self, args):
        self.args = args
        self.model_config = SimpleNamespace(get_vocab_size=lambda: 100)
        self.engine_core = SimpleNamespace(engine_core=SimpleNamespace(scheduler=_FakeScheduler(8), batch_queue=None))
        self.slept = []

    @classmethod
    def from_engine_args(cls, engine_args, enable_multiprocessing=False):
        assert enable_multiprocessing is False and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        return cls(engine_args)

    def add_request(self, request_id, prompt, params):
        rid = f"{request_id}-abcd1234"
        self.engine_core.engine_core.scheduler.reqs[rid] = dict(
            ext=request_id, prompt=len(prompt["prompt_token_ids"]), h=0, seen=False, max=params.max_tokens, out=0)
        return rid

    def has_unfinished_requests(self):
        return bool(self.engine_core.engine_core.scheduler.reqs)

    def step(self):
        sched = self.engine_core.engine_core.scheduler
        out = sched.schedule()
        results = []
        for rid, c in out.num_scheduled_tokens.items():
            r = sched.reqs[rid]
            if r["h"] >= r["prompt"]:  # the prompt is done: this step sampled a token
                r["out"] += 1
                r["h"] = r["prompt"] + r["out"] - 1
                fin = r["out"] >= r["max"]
                results.append(SimpleNamespace(request_id=r["ext"], finished=fin,
                                               outputs=[SimpleNamespace(token_ids=[7] * r["out"])]))
                if fin:
                    del sched.reqs[rid]
        return results

    def sleep(self, level=1):
        self.slept.append(("sleep", level))

    def wake_up(self, tags=None):
        self.slept.append(("wake",))
        return True


@pytest.fixture
def fake_vllm(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # restored afterwards; the engine must set it to 0
    params = lambda **kw: SimpleNamespace(**kw)  # noqa: E731
    mod = SimpleNamespace(EngineArgs=lambda **kw: kw, LLMEngine=_FakeLLMEngine, SamplingParams=params)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    return mod


def test_vllm_engine_steps_record_tokens_first_tokens_and_finishes(fake_vllm, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    eng = vllm_engine.VllmEngine(str(tmp_path), max_num_batched_tokens=8, enable_sleep_mode=False, seed=3,
                                 max_model_len=64)
    args = eng.engine.args
    assert args["load_format"] == "dummy" and args["skip_tokenizer_init"] and args["async_scheduling"] is False
    assert args["max_num_batched_tokens"] == 8 and args["max_model_len"] == 64 and "block_size" not in args
    eng.add_request("r1", 10, 2)
    eng.add_request("r2", 3, 1)
    recs = []
    while (rec := eng.step()) is not None:
        recs.append(rec)
    got = [(r.P, r.A, r.n, r.L, tuple(sorted(r.first_token)), r.finished) for r in recs]  # vLLM's output order
    assert got == [
        (8, 36, 0, 0, (), ()),                 # r1 chunk of 8 (A = 8*9/2)
        (5, 2 * 8 + 3 + 6, 0, 0, ("r1", "r2"), ("r2",)),  # r1's last 2 prompt tokens, r2's 3: both sample a
        (0, 0, 1, 11, (), ("r1",)),                       # token; r2 wanted one; r1 decodes at 10 computed
    ]
    assert all(r.elapsed_s >= 0 for r in recs) and not eng.has_work()
    assert eng._reqs == {} and eng._internal == {}
    with pytest.raises(NotImplementedError, match="enable_sleep_mode=True"):
        eng.sleep()


def test_vllm_engine_sleep_and_wake_with_sleep_mode(fake_vllm):
    eng = vllm_engine.VllmEngine("some/model", enable_sleep_mode=True)
    assert eng.engine.args["load_format"] == "auto"
    eng.sleep()
    eng.wake()
    assert eng.engine.slept == [("sleep", 1), ("wake",)]
    eng.add_request("x", 2, 1)
    with pytest.raises(RuntimeError, match="in flight"):
        eng.sleep()


def test_vllm_engine_fails_clearly_when_the_scheduler_is_out_of_reach(fake_vllm, monkeypatch):
    def multiprocess(cls, engine_args, enable_multiprocessing=False):
        e = cls(engine_args)
        e.engine_core = SimpleNamespace()  # an MP client: no in-process EngineCore
        return e

    monkeypatch.setattr(_FakeLLMEngine, "from_engine_args", classmethod(multiprocess))
    with pytest.raises(RuntimeError, match="engine_core.engine_core.scheduler"):
        vllm_engine.VllmEngine("m")


def test_vllm_engine_without_vllm_names_the_extra(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r'pip install "commitenv\[gpu\]"'):
        vllm_engine.VllmEngine("m")
