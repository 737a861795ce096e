"""`VllmEngine`: the `ServingEngine` seam over vLLM's engine, stepped in-process (V1 multiprocessing off), so each
`step` is one scheduler step whose token counts (P, A, n, L) are read from vLLM's scheduler output.

UNTESTED WITHOUT A GPU: written against vLLM 0.33.0's source (the PyPI wheel, commit g4ba787ec9) and never run;
only its pure helpers (`scheduled_chunks`, `step_terms`) are exercised on CPU, by tests/backends/test_backend_nvml.py.
vLLM is imported when an engine is built, not with this module; without it, ImportError names the ``gpu`` extra.

Internals relied on (all in `_scheduler_of`): ``LLMEngine.engine_core`` is an ``InprocClient`` whose ``engine_core``
is the ``EngineCore`` whose ``scheduler.schedule()`` returns the step's ``SchedulerOutput``
(vllm/v1/engine/llm_engine.py, core_client.py, core.py), and that output's fields ``num_scheduled_tokens``,
``scheduled_new_reqs[i].num_computed_tokens``, ``scheduled_cached_reqs.{req_ids,num_computed_tokens}`` and
``scheduled_spec_decode_tokens`` (vllm/v1/core/sched/output.py), recorded there before the scheduler advances
``num_computed_tokens`` (vllm/v1/core/sched/scheduler.py, ``_update_after_schedule``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from commitenv.backends.clock import Clock, WallClock
from commitenv.backends.engine import ServingEngine, StepRecord

VLLM_SOURCE_READ = "vLLM 0.33.0 (PyPI wheel, commit g4ba787ec9)"
_INSTALL_HINT = 'vLLM is not installed: pip install "commitenv[gpu]" (needs a CUDA GPU)'
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _import_vllm() -> tuple[Any, Any, Any]:
    """vLLM's EngineArgs, LLMEngine and SamplingParams, with V1 multiprocessing off (read by vllm.envs on use)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core must live in this process (see module doc)
    try:
        from vllm import EngineArgs, LLMEngine, SamplingParams
    except ImportError as e:
        raise ImportError(_INSTALL_HINT) from e
    return EngineArgs, LLMEngine, SamplingParams


def _scheduler_of(llm_engine: Any) -> Any:
    """The in-process scheduler behind ``llm_engine``: vLLM internals, read in vllm 0.33.0
    (vllm/v1/engine/llm_engine.py: ``self.engine_core = EngineCoreClient.make_client(...)``; core_client.py:
    ``InprocClient.engine_core = EngineCore(...)``; core.py: ``EngineCore.scheduler``, ``EngineCore.batch_queue``).
    Raises RuntimeError naming the missing attribute when a vLLM version lays them out otherwise."""
    client = getattr(llm_engine, "engine_core", None)
    core = getattr(client, "engine_core", None)
    sched = getattr(core, "scheduler", None)
    if sched is None or not callable(getattr(sched, "schedule", None)):
        raise RuntimeError(
            "VllmEngine: cannot reach vLLM's scheduler as LLMEngine.engine_core.engine_core.scheduler.schedule "
            f"(layout of {VLLM_SOURCE_READ}); is V1 multiprocessing off (VLLM_ENABLE_V1_MULTIPROCESSING=0), and "
            "does this vLLM version keep that layout?")
    if getattr(core, "batch_queue", None) is not None:
        raise RuntimeError("VllmEngine: vLLM's batch queue is on (async scheduling or pipeline parallelism), so "
                           "LLMEngine.step() would not run exactly one scheduled step; build with async_scheduling="
                           "False and no pipeline parallelism")
    return sched


def scheduled_chunks(scheduler_output: Any) -> list[tuple[str, int, int]]:
    """(request id, tokens scheduled c, tokens computed before the step h) for each request in a vLLM
    ``SchedulerOutput`` (vllm/v1/core/sched/output.py in 0.33.0). Speculative tokens are refused: the step laws
    have no term for them."""
    for name in ("num_scheduled_tokens", "scheduled_new_reqs", "scheduled_cached_reqs"):
        if not hasattr(scheduler_output, name):
            raise RuntimeError(f"VllmEngine: vLLM's SchedulerOutput has no attribute {name!r} "
                               f"(read in {VLLM_SOURCE_READ})")
    if getattr(scheduler_output, "scheduled_spec_decode_tokens", None):
        raise RuntimeError("VllmEngine: speculative decoding scheduled draft tokens; the step laws do not cover it")
    computed: dict[str, int] = {r.req_id: int(r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, (int(h) for h in cached.num_computed_tokens)))
    out = []
    for rid, c in scheduler_output.num_scheduled_tokens.items():
        if rid not in computed:
            raise RuntimeError(f"VllmEngine: request {rid} is scheduled but neither new nor cached in the "
                               "SchedulerOutput")
        out.append((rid, int(c), computed[rid]))
    return out


def step_terms(chunks: Iterable[tuple[int, int, int, int]]) -> tuple[int, int, int, int]:
    """The step laws' (P, A, n, L) from (c tokens scheduled, h computed before, prompt length, tokens generated before
    the step) per request, as the simulator counts them (tests/helpers/reference/replica.py `batch_terms`, the compiled
    loop's `_decode_flags`): a request decodes when it computes its one uncomputed token after a first output (L += h +
    1); anything else is a prefill chunk (P += c, A += c*h + c*(c+1)/2), recomputation after preemption included."""
    P = A = n = L = 0
    for c, h, prompt, generated in chunks:
        if c == 1 and generated >= 1 and h + 1 == prompt + generated:
            n += 1
            L += h + 1
        else:
            P += c
            A += c * h + c * (c + 1) // 2
    return P, A, n, L


def _has_weights(model: str) -> bool:
    p = Path(model)
    return any(f.suffix in _WEIGHT_SUFFIXES for f in p.rglob("*")) if p.is_dir() else True


class VllmEngine(ServingEngine):
    """vLLM on one GPU, stepped in-process. ``model``: a model name or local path; a local folder without weight
    files (a bare config.json) loads random weights (``load_format="dummy"``) unless ``load_format`` says otherwise.
    No tokenizer is loaded: prompts are random token ids (seeded), outputs are not detokenized. Further keyword
    arguments are vLLM EngineArgs (e.g. ``max_model_len``, ``enable_prefix_caching``). Generated-token counts are
    read from each step's outputs, so vLLM's ``stream_interval`` must stay 1 (its default)."""

    def __init__(self, model: str, *, max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
                 block_size: int | None = None, gpu_memory_utilization: float = 0.9, enforce_eager: bool = False,
                 enable_sleep_mode: bool = False, load_format: str | None = None, seed: int = 0,
                 clock: Clock | None = None, **engine_args: Any) -> None:
        EngineArgs, LLMEngine, SamplingParams = _import_vllm()
        self._SamplingParams = SamplingParams
        args: dict[str, Any] = dict(
            model=model, gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
            enable_sleep_mode=enable_sleep_mode, skip_tokenizer_init=True, seed=seed, async_scheduling=False,
            load_format=load_format or ("auto" if _has_weights(model) else "dummy"), disable_log_stats=True,
        )
        for k, v in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs),
                     ("block_size", block_size)):
            if v is not None:
                args[k] = v
        args.update(engine_args)
        self.engine = LLMEngine.from_engine_args(EngineArgs(**args), enable_multiprocessing=False)
        self._captured: list[Any] = []
        sched = _scheduler_of(self.engine)
        schedule = sched.schedule

        def recording_schedule(*a: Any, **kw: Any) -> Any:  # the step's SchedulerOutput, as the engine core sees it
            out = schedule(*a, **kw)
            self._captured.append(out)
            return out

        sched.schedule = recording_schedule
        self.sleep_mode = enable_sleep_mode
        self.clock = clock or WallClock()
        self._vocab = int(self.engine.model_config.get_vocab_size())
        self._rng = np.random.default_rng(seed)
        self._reqs: dict[str, list[Any]] = {}  # vLLM's (internal) request id -> [our id, prompt, generated]
        self._internal: dict[str, str] = {}  # our id -> vLLM's

    def add_request(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError(f"request {request_id}: prompt ({prompt_tokens}) and output ({max_tokens}) tokens must "
                             "be >= 1")
        ids = self._rng.integers(0, self._vocab, size=int(prompt_tokens)).tolist()
        params = self._SamplingParams(max_tokens=int(max_tokens), min_tokens=int(max_tokens), ignore_eos=True,
                                      temperature=0.0, detokenize=False)
        internal = self.engine.add_request(request_id, {"prompt_token_ids": ids}, params)
        internal = internal if isinstance(internal, str) else request_id  # recent vLLM suffixes ids, returns its own
        self._reqs[internal] = [request_id, int(prompt_tokens), 0]
        self._internal[request_id] = internal

    def has_work(self) -> bool:
        return bool(self.engine.has_unfinished_requests())

    def step(self) -> StepRecord | None:
        if not self.has_work():
            return None
        self._captured.clear()
        t_start = self.clock.now()
        t0 = time.perf_counter()
        outputs = self.engine.step()
        elapsed = time.perf_counter() - t0
        if len(self._captured) > 1:
            raise RuntimeError(f"VllmEngine: one LLMEngine.step() scheduled {len(self._captured)} batches")
        chunks = scheduled_chunks(self._captured[0]) if self._captured else []
        P, A, n, L = step_terms((c, h, *self._reqs[rid][1:]) for rid, c, h in chunks)
        first, finished, gone = [], [], []
        for o in outputs:  # RequestOutput carries the id we gave (0.33.0); token_ids are cumulative (the default)
            internal = self._internal.get(o.request_id, o.request_id)
            state = self._reqs[internal]
            generated = len(o.outputs[0].token_ids) if o.outputs else 0
            if state[2] == 0 and generated > 0:
                first.append(state[0])
            state[2] = generated
            if o.finished:
                finished.append(state[0])
                gone.append(internal)
        progress = tuple((self._reqs[rid][0], h + c, self._reqs[rid][2]) for rid, c, h in chunks)
        out = self._captured[0] if self._captured else None
        preempted = tuple(self._reqs[rid][0] for rid in sorted(getattr(out, "preempted_req_ids", None) or ())
                          if rid in self._reqs)
        for internal in gone:
            del self._internal[self._reqs[internal][0]], self._reqs[internal]
        return StepRecord(t_start, elapsed, P, A, n, L, tuple(first), tuple(finished), progress, preempted)

    def sleep(self) -> None:
        """vLLM sleep level 1: weights offloaded to CPU memory, KV cache dropped."""
        self._need_sleep_mode("sleep")
        if self.has_work():
            raise RuntimeError("VllmEngine.sleep: requests are in flight (vLLM would abort them)")
        self.engine.sleep(level=1)

    def wake(self) -> None:
        self._need_sleep_mode("wake")
        self.engine.wake_up()

    def _need_sleep_mode(self, what: str) -> None:
        if not self.sleep_mode:
            raise NotImplementedError(f"VllmEngine.{what}: built without sleep mode; pass enable_sleep_mode=True "
                                      "(vLLM's enable_sleep_mode, CUDA only)")

    def close(self) -> None:
        """Shut the engine core down (frees the GPU memory it holds)."""
        shutdown = getattr(getattr(self.engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
