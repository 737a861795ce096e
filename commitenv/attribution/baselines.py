"""Baseline splits StepSplit is compared with (section 3 and Insight 3).

* Token: shares proportional to ``p_i + 5*d_i`` (prompt and output tokens, weighted as API prices are).
* Solo: shares proportional to the energy of each request served alone (``v({i})`` of a game, e.g. the
  replay game: the request on a fresh engine at its arrival time), normalised to the window total.
* Time sharing: the request's own energy plus the shared energy split by time in flight: on every replica the
  shared (per-step) energy is treated as a constant power over its busy time, and at each instant that power
  is split equally among the requests of the step then running; a request's part is thus proportional to
  ``sum_k duration_k / m_k`` over the steps it is in (a long prefill step bills its decode companions for its
  length, which is the error Insight 3 measures).

Every function returns an `Attribution` that adds up to ``total_j`` (when given).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from commitenv.attribution.closed_form import Attribution
from commitenv.attribution.law import StepTable


def _finish(players, shares: np.ndarray, total_j: float | None, method: str) -> Attribution:
    players = np.arange(len(shares)) if players is None else np.asarray(players)
    att = Attribution(players, shares.astype(np.float64), None, None, None, method)
    return att if total_j is None else att.normalized(total_j)


def token_split(prompt_tokens, output_tokens, total_j: float, *, output_weight: float = 5.0,
                players: Sequence[int] | None = None) -> Attribution:
    """Token: ``total_j`` split in proportion to ``p_i + output_weight * d_i``."""
    w = np.asarray(prompt_tokens, dtype=np.float64) + output_weight * np.asarray(output_tokens, dtype=np.float64)
    return _finish(players, w, total_j, "token")


def solo_split(game, total_j: float, *, players: Sequence[int] | None = None) -> Attribution:
    """Solo: ``total_j`` split in proportion to each player's value alone, ``game.value(1 << i)``."""
    solo = np.array([game.value(1 << i) for i in range(game.n)])
    return _finish(players, solo, total_j, "solo")


def time_sharing_split(steps: StepTable, total_j: float | None = None, *, scale: str = "step") -> Attribution:
    """Time sharing with the same own energies as step sharing (see the module docstring)."""
    f = steps.scale(scale)
    ent = steps.entry_of
    own = np.bincount(steps.member, weights=steps.own_law * f[ent], minlength=steps.n)
    shared_e = f * steps.shared_law
    dur = np.maximum(steps.t1 - steps.t0, 0.0)
    tw = (dur / steps.m)[ent]  # each member's time share of its segment
    shared = np.zeros(steps.n)
    for r in np.unique(steps.replica):
        sel_e = steps.replica == r
        sel_m = sel_e[ent]
        pool_j = float(shared_e[sel_e].sum())
        w = np.bincount(steps.member[sel_m], weights=tw[sel_m], minlength=steps.n)
        if w.sum() > 0:
            shared += pool_j * w / w.sum()
        else:  # zero-duration steps: fall back to equal split per step
            shared += np.bincount(steps.member[sel_m], weights=(shared_e / steps.m)[ent][sel_m], minlength=steps.n)
    att = Attribution(steps.players, own + shared, own, shared, None, "time_sharing")
    return att if total_j is None else att.normalized(total_j)
