"""Running the library's own entry points (the environment, `run_fixed`, StepSplit replays) on the reference engine:
the modules that build a `Pool` build a `ReferencePool` instead while the switch is on."""

from __future__ import annotations

import pytest

from commitenv.sim.pool import Pool
from commitenv.sim.view import take_snapshot

from helpers.reference.copies import reference_snapshot
from helpers.reference.pool import ReferencePool

# the modules that construct pools, by the name they import `Pool` under
BUILDERS = ("commitenv.envs.commit_serve", "commitenv.sim.fixed", "commitenv.attribution.replay")


def use_engine(monkeypatch: pytest.MonkeyPatch, reference: bool) -> None:
    """From here on (until ``monkeypatch`` undoes it) pools are built on the reference engine if ``reference``, else
    on the compiled loop."""
    for mod in BUILDERS:
        monkeypatch.setattr(f"{mod}.Pool", ReferencePool if reference else Pool)
    monkeypatch.setattr("commitenv.envs.commit_serve.take_snapshot", reference_snapshot if reference else take_snapshot)


def step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment's engines step by step (`EngineOptions.closed_form` off), as the reference always does: an
    episode on either engine is then comparable bit for bit."""
    import dataclasses

    from commitenv.envs import commit_serve

    options = commit_serve.engine_options
    monkeypatch.setattr(commit_serve, "engine_options",
                        lambda *a, **k: dataclasses.replace(options(*a, **k), closed_form=False))
