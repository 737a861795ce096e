"""Register every shipped scenario and site with Gymnasium as ``commitenv/<name>-v0``.

Registration reads only file names (no scenario is parsed, no environment module is imported), so importing
commitenv stays cheap and a broken scenario file surfaces when that scenario is made, not at import.
"""

from __future__ import annotations

from commitenv.scenarios.loader import env_id, list_scenarios, load_scenario
from commitenv.scenarios.schema import ScenarioError

ENTRY_POINT = "commitenv.envs:CommitServeEnv"
SITE_ENTRY_POINT = "commitenv.site:SiteEnv"  # sites (``sites/*.yaml``) register beside the scenarios


def register_all() -> list[str]:
    """Register each shipped scenario and site (idempotent: ids already registered are skipped). Returns the ids
    registered by this call."""
    from commitenv.site.loader import list_sites  # (reads file names only, as list_scenarios does)

    added = _register(list_scenarios(), ENTRY_POINT, "scenario")
    return added + _register(list_sites(), SITE_ENTRY_POINT, "site")


def _register(names: list[str], entry_point: str, kwarg: str) -> list[str]:
    import gymnasium as gym

    added = []
    for name in names:
        eid = env_id(name)
        if eid in gym.envs.registry:
            continue
        gym.register(id=eid, entry_point=entry_point, kwargs={kwarg: name}, max_episode_steps=None)
        added.append(eid)
    return added


def describe_scenarios() -> list[tuple[str, str]]:
    """``(env id, one-line description)`` for every shipped scenario, sorted by name (for ``commitenv
    scenarios``). A file that fails to load is listed with its error instead of a description."""
    out = []
    for name in list_scenarios():
        try:
            sc = load_scenario(name)
        except ScenarioError as e:
            out.append((env_id(name), f"INVALID: {e}"))
            continue
        lines = [ln.strip() for ln in sc.description.strip().splitlines() if ln.strip()]
        out.append((sc.env_id, lines[0] if lines else ""))
    return out
