"""`ProcessEngine`: an engine in its own process answers exactly as the same engine in this process (every step
record equal, on the fake engine's virtual clock), reports the child's errors with their message, and refuses calls
after close; `vllm_backend` checks its GPU list against the scenario before touching a GPU."""

from __future__ import annotations

import pytest

from commitenv.backends.fake_engine import standalone_sim_engine
from commitenv.backends.process_engine import EngineProcessError, ProcessEngine, vllm_backend
from commitenv.profiles import load_profile

PROFILE = "h200-qwen3.8-27b-fp8"
REQUESTS = [("a", 700, 12), ("b", 3000, 5), ("c", 20, 40), ("d", 1500, 1), ("e", 64, 64)]


def _records(engine):
    for rid, p, o in REQUESTS:
        engine.add_request(rid, p, o)
    out = []
    while engine.has_work():
        out.append(engine.step())
    return out


def test_an_engine_in_its_own_process_answers_as_in_this_one():
    prof = load_profile(PROFILE)
    here = _records(standalone_sim_engine(prof, noise_sigma=0.1, seed=3))
    eng = ProcessEngine(standalone_sim_engine, prof, noise_sigma=0.1, seed=3, name="GPU 0")
    try:
        there = _records(eng)
        assert eng.step() is None
        eng.sleep()
        eng.wake()
        with pytest.raises(EngineProcessError, match=r"GPU 0: add_request\(\) failed .*must be >= 1"):
            eng.add_request("bad", 0, 5)
        assert eng.has_work() is False  # the engine lives on after an error
    finally:
        eng.close()
    assert len(here) > 5 and there == here
    with pytest.raises(EngineProcessError, match="after close"):
        eng.step()


def _broken_factory():
    raise OSError("no such device")


def test_a_factory_that_fails_is_reported_and_vllm_backend_checks_the_gpu_count():
    with pytest.raises(EngineProcessError, match="start failed in the engine process: OSError: no such device"):
        ProcessEngine(_broken_factory, name="GPU 7")
    build = vllm_backend("some-model", gpus=[0, 1])
    with pytest.raises(ValueError, match="3 replicas but 2 GPUs"):
        build(load_profile(PROFILE), 3, None, 1980)
