"""The ``gpu`` extra pins the vLLM release whose internals `VllmEngine` was written against (it reads the
scheduler's private layout, which moves between releases)."""

from __future__ import annotations

import re
import tomllib

from commitenv.backends import vllm_engine
from helpers.paths import ROOT


def test_gpu_extra_pins_the_vllm_the_engine_reads():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    gpu = meta["project"]["optional-dependencies"]["gpu"]
    pins = [d for d in gpu if re.match(r"^vllm\b", d)]
    assert len(pins) == 1, gpu
    m = re.fullmatch(r"vllm==(\d+\.\d+\.\d+)", pins[0].replace(" ", ""))
    assert m, f"the gpu extra must pin one vLLM release exactly, got {pins[0]!r}"
    written = re.search(r"vLLM (\d+\.\d+\.\d+)", vllm_engine.VLLM_SOURCE_READ)
    assert written and m.group(1) == written.group(1)
