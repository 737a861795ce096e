"""The listing subcommands: ``scenarios``, ``controllers``, ``profiles`` and ``workloads``."""

from __future__ import annotations

import argparse


def cmd_scenarios(args: argparse.Namespace) -> int:
    """List the registered scenarios: Gymnasium id and description."""
    from commitenv.scenarios import describe_scenarios

    for env_id, desc in describe_scenarios():
        print(f"{env_id:<42} {desc}")
    return 0


def cmd_controllers(args: argparse.Namespace) -> int:
    """List registered and entry-point controllers: name, origin, description."""
    from commitenv.registry import discover

    rows = discover()
    w = max(len(r.name) for r in rows)
    wo = max(len(r.origin) for r in rows)
    for r in rows:
        print(f"{r.name:<{w}}  {r.origin:<{wo}}  {r.doc}".rstrip())
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    """List the shipped GPU x model profiles."""
    from commitenv.profiles import list_profiles, load_profile

    for name in list_profiles():
        p = load_profile(name)
        print(f"{name:<28} {p.gpu.name:<8} {p.model.name:<20} clocks {p.clock_mhz} MHz")
    return 0


def cmd_workloads(args: argparse.Namespace) -> int:
    """List the built-in workloads."""
    from commitenv.workload import list_builtin

    for name in list_builtin():
        print(name)
    return 0
