"""Every code block of README.md runs as written: each ```python block as a script in a fresh interpreter (a block
whose first line is ``# NAME.py`` is saved under that name, so later blocks can use it), and each ```bash block
marked ``<!-- readme-test: run -->`` in the same folder. The dispatch example is also held to what it claims."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers.paths import ROOT

README = ROOT / "README.md"
RUN_MARK = "<!-- readme-test: run -->"
_BLOCK = re.compile(r"(<!-- readme-test: run -->\n)?```(\w+)\n(.*?)```", re.S)


def blocks() -> list[tuple[str, str, bool]]:
    """``(language, code, marked runnable)`` of every fenced block, in order."""
    return [(m.group(2), m.group(3), m.group(1) is not None) for m in _BLOCK.finditer(README.read_text())]


def _file_name(code: str) -> str | None:
    m = re.match(r"# ([\w.-]+\.py)\n", code)
    return m.group(1) if m else None


def _python_blocks() -> list[str]:
    return [code for lang, code, _ in blocks() if lang == "python"]


def _bash_runnable() -> list[str]:
    return [code for lang, code, run in blocks() if lang == "bash" and run]


def _folder(tmp_path: Path) -> Path:
    """A fresh folder holding every named python block (what the README tells the reader to save)."""
    for code in _python_blocks():
        name = _file_name(code)
        if name:
            (tmp_path / name).write_text(code)
    return tmp_path


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.setdefault("COMMITENV_CACHE", str(cwd / ".cache"))
    bindir = str(Path(sys.executable).parent)  # the console script `commitenv` lives beside this interpreter
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_readme_has_the_blocks_a_newcomer_needs():
    langs = [lang for lang, _, _ in blocks()]
    assert langs.count("python") >= 3 and _bash_runnable()
    assert len(README.read_text().splitlines()) <= 200
    assert "## Run the tests" in README.read_text() and "python -m pytest" in README.read_text()  # as .ci/run


@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_python_block_runs_as_written(tmp_path, index):
    code = _python_blocks()[index]
    folder = _folder(tmp_path)
    script = folder / (_file_name(code) or f"block_{index}.py")
    script.write_text(code)
    done = _run([sys.executable, script.name], folder)
    assert done.returncode == 0, f"README python block {index} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("index", range(len(_bash_runnable())))
def test_marked_bash_block_runs_as_written(tmp_path, index):
    folder = _folder(tmp_path)
    done = _run(["bash", "-euo", "pipefail", "-c", _bash_runnable()[index]], folder)
    assert done.returncode == 0, f"README bash block {index} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def test_the_dispatch_example_spreads_requests_and_meets_the_gate():
    """The README's LeastTokens router always picks a least-loaded candidate, gives no replica a quarter of the
    requests (routing on waiting queues alone gave replica 0 40 %), and attains what the engine's default router
    attains on the same episode, passing the scenario's absolute gate (>= 99 % per arrival hour)."""
    from commitenv.control import Controller
    from commitenv.evaluation import run_episode

    code = next(c for c in _python_blocks() if "class LeastTokens" in c)
    ns: dict = {}
    exec(compile(code, "README-dispatch", "exec"), ns)  # not __main__: defines the classes only
    chosen: Counter = Counter()

    class Recorded(ns["LeastTokens"]):
        def choose(self, req, replicas):
            i = super().choose(req, replicas)
            load = {r.index: r.queued_prefill_tokens + r.decode_context_tokens for r in replicas}
            assert load[i] == min(load.values())
            chosen[i] += 1
            return i

    class Routed(ns["Routed"]):
        def dispatch_policy(self):
            return Recorded()

    class DefaultRouter(Controller):
        def act(self, observation, info):
            return self.ctx.action(self.ctx.n_replicas, self.ctx.reference_clock_mhz)

    scenario, seed = "bench-h200-hour-fixed-a30", 100000
    _, res = run_episode(Routed(), scenario, seed=seed)
    _, ref = run_episode(DefaultRouter(), scenario, seed=seed)
    assert sum(chosen.values()) == res.summary["requests"] - res.summary["rejected"]
    assert max(chosen.values()) < 0.25 * sum(chosen.values())
    assert res.summary["slo_gate_pass"] and res.summary["attainment_pct"] >= 99.0
    assert res.summary["attainment_pct"] == pytest.approx(ref.summary["attainment_pct"], abs=0.05)
