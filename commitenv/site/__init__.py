"""Sites: several pools behind one meter and one hourly commitment (`load_site`, `SiteEnv`; the pools as PettingZoo
agents in `commitenv.site.agents`, one controller per pool in `commitenv.site.runner`)."""

from importlib import import_module
from typing import TYPE_CHECKING

# Public names and the submodule defining each, loaded on first use: registering the shipped sites (at ``import
# commitenv``) reads file names only and must not pull in the engine.
_WHERE = {
    **dict.fromkeys(["SITE_FEATURES", "SiteEnv"], "env"),
    "pool_seed": "pools",
    **dict.fromkeys(["Site", "SitePool", "list_sites", "load_site"], "loader"),
    "SiteError": "schema",
}


def __getattr__(name: str):
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


if TYPE_CHECKING:  # for type checkers and IDEs
    from commitenv.site.env import SITE_FEATURES, SiteEnv
    from commitenv.site.loader import Site, SitePool, list_sites, load_site
    from commitenv.site.pools import pool_seed
    from commitenv.site.schema import SiteError

__all__ = ["SITE_FEATURES", "Site", "SiteEnv", "SiteError", "SitePool", "list_sites", "load_site", "pool_seed"]
