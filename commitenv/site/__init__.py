"""Sites: several pools behind one meter and one hourly commitment (`load_site`, `SiteEnv`; the pools as PettingZoo
agents in `commitenv.site.agents`, one controller per pool in `commitenv.site.runner`)."""

from typing import TYPE_CHECKING

from commitenv._lazy import lazy_names

# Public names and the submodule defining each, loaded on first use: registering the shipped sites (at ``import
# commitenv``) reads file names only and must not pull in the engine.
_WHERE = {
    **dict.fromkeys(["SITE_FEATURES", "SiteEnv"], "env"),
    "pool_seed": "pools",
    **dict.fromkeys(["Site", "SitePool", "list_sites", "load_site"], "loader"),
    "SiteError": "schema",
}


__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())


if TYPE_CHECKING:  # for type checkers and IDEs
    from commitenv.site.env import SITE_FEATURES, SiteEnv
    from commitenv.site.loader import Site, SitePool, list_sites, load_site
    from commitenv.site.pools import pool_seed
    from commitenv.site.schema import SiteError

__all__ = ["SITE_FEATURES", "Site", "SiteEnv", "SiteError", "SitePool", "list_sites", "load_site", "pool_seed"]
