"""The command line's argument checks: the output folder, controller specs and their ``--controller-arg``
values, the seed flags, and ``--backend``; each bad value is a ValueError naming the flag."""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from commitenv.comparison import ComparedController


def check_out(out: str | None, *, beside: bool = False) -> Path | None:
    """Fail early (before any run) when ``out`` cannot become a writable folder: create it (and any missing
    parents) and a temporary file in it, then remove all that was created, so nothing is left behind. With
    ``beside`` also create a temporary folder next to ``out`` (where `EvalResult.write` builds its files)."""
    if out is None:
        return None
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"--out {out}: cannot create folder ({probe} is a file)")
    made: list[Path] = []
    step = "cannot create folder"
    try:
        for d in reversed([p, *p.parents]):
            if not d.exists():
                step = f"cannot create folder {d}" if d != p else "cannot create folder"
                d.mkdir()
                made.append(d)
        step = "cannot write a file in it"
        fd, f = tempfile.mkstemp(prefix=".commitenv-probe-", dir=p)
        os.close(fd)
        os.unlink(f)
        if beside:
            step = f"cannot write beside it in {p.parent}"
            os.rmdir(tempfile.mkdtemp(prefix=".commitenv-probe-", dir=p.parent))
    except OSError as e:
        raise ValueError(f"--out {out}: {step} ({e.strerror or type(e).__name__})") from None
    finally:
        for d in reversed(made):
            try:
                d.rmdir()
            except OSError:
                pass
    return p


def write_run(res, dest: Path, out: Path, **kw) -> None:
    """``res.write(dest)`` (``dest`` is ``out`` or a sub-folder of it), an OSError restated about the user's
    ``--out`` folder."""
    try:
        res.write(dest, **kw)
    except OSError as e:
        msg = (e.strerror or str(e)).removeprefix(f"{dest}: ")
        where = "" if dest == out else f" ({dest.name}/)"
        raise ValueError(f"--out {out}{where}: {msg}") from None


def resolve_names(scenario: str, controllers: list[str]) -> list:
    """Check the scenario and resolve every controller spec (`controllers.resolve`); ValueError otherwise."""
    from commitenv.scenarios import load_scenario
    from commitenv.registry import resolve

    load_scenario(scenario)
    return [resolve(c) for c in controllers]


_ARG = re.compile(r"^(?:(?P<scope>[^=]+)\.)?(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$", re.S)


def parse_controller_args(items: list[str] | None) -> list[tuple[str | None, str, str]]:
    """``--controller-arg [CONTROLLER.]KEY=VALUE`` items as (scope, key, raw value)."""
    out = []
    for item in items or []:
        m = _ARG.match(item)
        if not m:
            raise ValueError(f"--controller-arg {item}: expected KEY=VALUE (KEY a Python identifier; in compare "
                             "optionally CONTROLLER.KEY=VALUE)")
        out.append((m.group("scope"), m.group("key"), m.group("value")))
    return out


def controller_kwargs(resolved, given: str, args: list[tuple[str | None, str, str]], *,
                      scoped: bool) -> dict:
    """The validated constructor arguments of one controller (``given``: the spec as typed): unscoped
    arguments, and with ``scoped`` those whose scope is its spec or its name."""
    from commitenv.registry import check_kwargs
    from commitenv.registry import parse_arg_value

    raw = {}
    for scope, key, value in args:
        if scope is None or (scoped and scope in (given, resolved.name)):
            raw[key] = value
    kwargs = check_kwargs(resolved, {k: parse_arg_value(v) for k, v in raw.items()}, raw)
    return kwargs


_RAY_ADDRESS = re.compile(r"^(auto|local|ray://\S+|[\w.-]+:\d+)$")


def check_seed_flags(args: argparse.Namespace) -> None:
    """--jobs, --rerun and --ray belong to --seeds (many episodes); --ray's ADDRESS must look like one."""
    if args.seeds is None:
        given = [flag for flag, on in (("--jobs", args.jobs not in (None, 1)), ("--rerun", args.rerun),
                                       ("--ray", args.ray is not None)) if on]
        if given:
            raise ValueError(f"{given[0]}: only with --seeds (many episodes)")
    if args.ray is not None and not _RAY_ADDRESS.match(args.ray):
        raise ValueError(f"--ray {args.ray}: not a Ray address (ray://HOST:10001, HOST:PORT or auto); to start a "
                         f"local Ray give --ray without one, after the scenario")


def parse_backend(text: str | None):
    """``--backend fake[:SPEED]``: the CPU fakes of a GPU pool on a clock SPEED times real time (default 200)."""
    if text is None or text == "sim":
        return None
    kind, colon, speed = text.partition(":")
    if kind != "fake":
        raise ValueError(f"--backend {text}: expected sim or fake[:SPEED] (real GPUs: build a pool factory in Python, "
                         "docs/real-gpu.md)")
    try:
        x = float(speed) if colon else 200.0
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"--backend {text}: SPEED must be a finite number > 0 (how many times real time the fakes "
                         f"run, e.g. fake:20), got {speed!r}")
    from commitenv.backends.pool import fake_backend

    return fake_backend(speed=x)


def compared_controllers(args: argparse.Namespace) -> list[ComparedController]:
    """The controllers ``compare`` runs, with their constructor arguments; names must be distinct. Without
    ``--controllers``: `commitenv.comparison.default_controllers` (no hindsight bound)."""
    from commitenv.comparison import ComparedController, default_controllers

    cargs = parse_controller_args(args.controller_arg)
    explicit = bool(args.controllers)
    if explicit:
        given = [c.strip() for c in args.controllers.split(",") if c.strip()]
        if not given:
            raise ValueError("--controllers: no controller given")
        resolved = resolve_names(args.scenario, given)
    else:
        resolve_names(args.scenario, [])
        found = default_controllers()
        given, resolved = [n for n, _ in found], [r for _, r in found]
    seen: dict[str, str] = {}
    for g, r in zip(given, resolved):
        if r.name in seen:
            raise ValueError(f"--controllers: '{seen[r.name]}' and '{g}' are both named '{r.name}'; their results "
                             "would share a folder")
        seen[r.name] = g
    for scope, key, _ in cargs:
        if scope is not None and scope not in seen and scope not in seen.values():
            raise ValueError(f"--controller-arg {scope}.{key}: no controller '{scope}' in this comparison "
                             f"({', '.join(seen)})")
    return [ComparedController(r, controller_kwargs(r, g, cargs, scoped=True)) for g, r in zip(given, resolved)]
