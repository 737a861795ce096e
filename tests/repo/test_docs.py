"""The reference docs hold: docs/scenarios.md's field table equals the scenario schema (every field, its default),
its minimal scenario runs, the reference pages' python blocks run as written, and no markdown link in README.md or
docs/ points at a missing file or outside the repository."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import BaseModel

from commitenv.scenarios.realism import Realism
from commitenv.scenarios.schema import Scenario
from helpers.paths import ROOT

SCENARIOS_MD = ROOT / "docs" / "scenarios.md"
REQUIRED = "required"


def _nested(annotation) -> tuple[type, str] | None:
    """The model (or dataclass) a field holds, and the list markers on the way (``[]`` per list level)."""
    if typing.get_origin(annotation) is list:
        inner = _nested(typing.get_args(annotation)[0])
        return (inner[0], "[]" + inner[1]) if inner else None
    if isinstance(annotation, type) and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)):
        return annotation, ""
    for arg in typing.get_args(annotation):  # Optional[...] / unions
        found = _nested(arg)
        if found:
            return found
    return None


def schema_defaults(model: type, prefix: str = "") -> dict[str, object]:
    """Every leaf field path of the scenario schema -> its default (``REQUIRED`` when the file must give it).
    ``realism`` is one leaf: its level's default (its components are in docs/realism.md)."""
    out: dict[str, object] = {}
    if dataclasses.is_dataclass(model):
        for f in dataclasses.fields(model):
            out[prefix + f.name] = f.default
        return out
    for name, f in model.model_fields.items():
        nested = _nested(f.annotation)
        if nested and nested[0] is not Realism:
            out.update(schema_defaults(nested[0], f"{prefix}{name}{nested[1]}."))
        elif f.is_required():
            out[prefix + name] = REQUIRED
        else:
            d = f.default_factory() if f.default_factory is not None else f.default
            out[prefix + name] = d.level if isinstance(d, Realism) else d
    return out


def documented_defaults() -> dict[str, object]:
    """The ``| `field` | default | unit | meaning |`` rows of docs/scenarios.md's table, defaults read as YAML."""
    rows: dict[str, object] = {}
    for line in SCENARIOS_MD.read_text().splitlines():
        m = re.match(r"^\| `([a-z_.\[\]]+)` \| ([^|]+) \|", line)
        if not m:
            continue
        field, default = m.group(1), m.group(2).strip()
        assert field not in rows, f"docs/scenarios.md: field {field} listed twice"
        rows[field] = REQUIRED if default == REQUIRED else yaml.safe_load(default.strip("`"))
    return rows


def test_every_schema_field_is_documented_with_its_default():
    schema, docs = schema_defaults(Scenario), documented_defaults()
    assert len(schema) > 50  # the walk reached the nested models
    assert sorted(set(schema) - set(docs)) == [], "fields missing from docs/scenarios.md"
    assert sorted(set(docs) - set(schema)) == [], "docs/scenarios.md lists fields the schema does not have"
    wrong = {k: (docs[k], schema[k]) for k in schema if docs[k] != schema[k]}
    assert wrong == {}, "documented default != schema default: {field: (docs, schema)}"


def test_the_documented_miss_penalty_default_is_what_every_shipped_scenario_states():
    stated = {yaml.safe_load(p.read_text()).get("miss_penalty_kwh") for p in (ROOT / "scenarios").glob("*.yaml")}
    assert stated == {documented_defaults()["miss_penalty_kwh"]} == {0.015}


def _yaml_block(md: Path, heading: str) -> str:
    text = md.read_text()
    section = text[text.index(heading):]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def test_the_minimal_scenario_runs_on_a_plain_csv_trace(tmp_path):
    from commitenv.envs import CommitServeEnv

    rng = np.random.default_rng(0)
    n = 300
    t = np.sort(rng.uniform(0, 3500, n))
    lines = ["arrival_s,prompt_tokens,output_tokens"]
    lines += [f"{a:.3f},{p},{o}" for a, p, o in zip(t, rng.integers(50, 2000, n), rng.integers(1, 400, n))]
    (tmp_path / "my_trace.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "my-hour.yaml").write_text(_yaml_block(SCENARIOS_MD, "## A minimal scenario of your own"))
    env = CommitServeEnv(str(tmp_path / "my-hour.yaml"))
    sc = env.scenario
    assert (sc.interval_s, sc.lambda_plus, sc.lambda_minus, sc.alpha, sc.epsilon, sc.miss_penalty_kwh,
            sc.realism.level) == (60.0, 2.0, 1.0, 3.0, 0.01, 0.015, "paper")
    obs, info = env.reset(seed=0)
    steps, done, truncated = 0, False, False
    while not (done or truncated):
        obs, reward, done, truncated, info = env.step({"active": 8, "clock": len(env.clocks_mhz) - 1})
        steps += 1
    assert steps == 60
    assert info["settlement"]["commitment_j"] == pytest.approx(3.5e6)
    assert len(env.table) == n  # every row of the trace was served in the episode


def test_every_documented_trace_example_loads_in_its_format(tmp_path):
    """The ``Trace formats`` examples are files `load_trace` reads, one per format, every row kept."""
    from commitenv.workload import load_trace

    text = SCENARIOS_MD.read_text()
    section = text[text.index("## Trace formats"):text.index("## Commitments")]
    examples = re.findall(r"```\n(.*?)```", section, re.S)
    formats = []
    for i, body in enumerate(examples):
        path = tmp_path / (f"t{i}.jsonl" if body.startswith("{") else f"t{i}.csv")
        path.write_text(body)
        table = load_trace(path)
        rows = [ln for ln in body.splitlines() if ln.strip()][(0 if body.startswith("{") else 1):]
        assert len(table) == len(rows)
        formats.append(table.meta["format"])
    assert formats == ["plain", "azure", "burstgpt", "mooncake"]


def _python_blocks_of_reference_pages() -> list[tuple[str, int, str]]:
    """``(page, index, code)`` of every ```python block of docs/*.md (docs/results/ holds records, not examples;
    training.md's, real-gpu.md's and leaderboard.md's own tests cover their examples)."""
    out = []
    for md in sorted((ROOT / "docs").glob("*.md")):
        if md.name in ("training.md", "real-gpu.md", "leaderboard.md"):
            continue
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", md.read_text(), re.S)):
            out.append((md.name, i, code))
    return out


@pytest.mark.parametrize("page, index, code", _python_blocks_of_reference_pages(),
                         ids=[f"{p}-{i}" for p, i, _ in _python_blocks_of_reference_pages()])
def test_reference_page_python_block_runs(tmp_path, page, index, code):
    script = tmp_path / "block.py"
    script.write_text(code)
    env = dict(os.environ)
    env.setdefault("COMMITENV_CACHE", str(tmp_path / ".cache"))
    done = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{page} python block {index} failed:\n{done.stderr[-4000:]}"


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _owned_markdown() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("md", _owned_markdown(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve_inside_the_repository(md):
    for target in _LINK.findall(md.read_text()):
        if re.match(r"^[a-z]+://", target):
            continue
        path = (md.parent / target).resolve()
        assert path.is_relative_to(ROOT), f"{md.name}: link {target} points outside the repository"
        assert path.exists(), f"{md.name}: link {target} does not exist"
