"""Running the library's own entry points (the environment, StepSplit replays) on the reference engine:
the modules that build a `Pool` build a `ReferencePool` instead while the switch is on."""

from __future__ import annotations

import pytest

from commitenv.sim.devices import device_state
from commitenv.sim.pool import Pool
from commitenv.sim.view import take_snapshot

from helpers.reference.copies import reference_device_state, reference_snapshot
from helpers.reference.pool import ReferencePool

# the modules that construct the pools under test, by the name they import `Pool` under
BUILDERS = ("commitenv.envs.commit_serve", "commitenv.attribution.replay")
# the modules that read a pool's devices (`commitenv.sim.devices.device_state`)
READERS = ("commitenv.attribution.law", "commitenv.attribution.ledger", "commitenv.attribution.online",
           "commitenv.envs.actions")


def use_engine(monkeypatch: pytest.MonkeyPatch, reference: bool) -> None:
    """From here on (until ``monkeypatch`` undoes it) pools are built on the reference engine if ``reference``, else
    on the compiled loop. (A scenario's commitments, made from a reference run by `commitenv.sim.fixed`, stay the
    library's: they are the scenario's input, and cached.)"""
    for mod in BUILDERS:
        monkeypatch.setattr(f"{mod}.Pool", ReferencePool if reference else Pool)
    monkeypatch.setattr("commitenv.envs.commit_serve.take_snapshot", reference_snapshot if reference else take_snapshot)
    for mod in READERS:
        monkeypatch.setattr(f"{mod}.device_state", reference_device_state if reference else device_state)


def step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment's engines step by step (`EngineOptions.closed_form` off), as the reference always does: an
    episode on either engine is then comparable bit for bit."""
    import dataclasses

    from commitenv.envs import commit_serve

    options = commit_serve.engine_options
    monkeypatch.setattr(commit_serve, "engine_options",
                        lambda *a, **k: dataclasses.replace(options(*a, **k), closed_form=False))
