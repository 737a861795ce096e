"""Per-request energy attribution with StepSplit: closed-form Shapley shares from the step log, exact and sampled
Shapley values, the scheduler-replay game on the engine itself, baselines, an online ledger and the MoE split.

Typical use on one window served from an idle engine (players are the window table's rows)::

    law = StepLaw.from_profiles(profile, layout, clock_mhz)            # or StepLaw.from_pool(pool)
    cf = closed_form_for(pool.log, table, law)                           # Proposition 5.1, sums to logged energy
    game = ReplayGame(table, profile, layout, clock_mhz=clock_mhz)       # the engine replays every coalition
    res = replay_shapley(game, control=model_game_for(pool.log, table, law), n_pairs=20,
                         total_j=cf.total_j)                             # replay-corrected, sums to the total

Online on a running pool (what `CommitServeEnv(..., attribution=True)` uses; no step log kept)::

    att = PoolAttributor(pool)                 # hooks pool.on_step; pool attached to its table
    pool.run_until(t); pool.settle(t)
    split = att.close(t)                       # PeriodSplit: metered = busy (shares) + idle, per tenant
    att.own_j, att.shared_j                    # per-request bills so far (final once finished)

On a hardware pool (`commitenv.backends.pool.HardwarePool`), `HardwareAttributor(pool)` does the same from the
workers' step log and the GPUs' energy counters (busy = counter energy - the profile's floor over uncovered time).

Prefix caching (section 6.7): `prefix_split` adds the equal split of every cached block's prefill to step sharing;
`ReplayGame` serves tables with prefix hash blocks through the engine's prefix cache, and `model_game_for` then
returns the matching `PrefixModelGame` as control variate.

`cost_split.hour_cost_shares` splits an hour's settlement cost among tenants by their Shapley values in the cost
game of the hour's energy (idle energy's cost to the operator).

`windows.replay_correction` applies the scheduler-replay correction to a finished run's bills, window by window.
"""

from commitenv.attribution.baselines import solo_split, time_sharing_split, token_split
from commitenv.attribution.closed_form import Attribution, closed_form, closed_form_from_log, l1_distance
from commitenv.attribution.cost_split import CostSplit, hour_cost_shares
from commitenv.attribution.law import OwnTracker, StepLaw, StepTable, decompose
from commitenv.attribution.ledger import Ledger, WindowSettlement, ledger_horizon
from commitenv.attribution.moe import moe_game, moe_split
from commitenv.attribution.prefix import PrefixModelGame, prefix_split
from commitenv.attribution.hardware import HardwareAttributor
from commitenv.attribution.online import PeriodSplit, PoolAttributor, token_split_bills
from commitenv.attribution.replay import (
    ReplayGame,
    ReplayResult,
    closed_form_for,
    model_game_for,
    replay_shapley,
)
from commitenv.attribution.shapley import (
    FunctionGame,
    ModelGame,
    ShapleyEstimate,
    TabularGame,
    coalition_values,
    exact_shapley,
    marginals,
    sample_permutations,
    sample_shapley,
    shapley_from_values,
)

__all__ = [
    "Attribution",
    "CostSplit",
    "FunctionGame",
    "HardwareAttributor",
    "Ledger",
    "ModelGame",
    "OwnTracker",
    "PeriodSplit",
    "PoolAttributor",
    "PrefixModelGame",
    "ReplayGame",
    "ReplayResult",
    "ShapleyEstimate",
    "StepLaw",
    "StepTable",
    "TabularGame",
    "WindowSettlement",
    "closed_form",
    "closed_form_for",
    "closed_form_from_log",
    "coalition_values",
    "decompose",
    "exact_shapley",
    "hour_cost_shares",
    "l1_distance",
    "ledger_horizon",
    "marginals",
    "model_game_for",
    "prefix_split",
    "moe_game",
    "moe_split",
    "replay_shapley",
    "sample_permutations",
    "sample_shapley",
    "shapley_from_values",
    "solo_split",
    "time_sharing_split",
    "token_split",
    "token_split_bills",
]
