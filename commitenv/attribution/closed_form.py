"""Step sharing, the closed-form Shapley value of the model game (StepSplit Proposition 5.1).

    phi_i = e_i + sum_{k : i in M_k} a(m_k) / m_k

``e_i`` is request i's own energy under the law (summed over the steps it is in; chunked-prefill attention
terms telescope) and ``a(m_k)`` the shared energy of step k, split equally among its ``m_k`` requests however
long the step lasts. A logged decode run of ``n`` steps with ``m`` requests gives each member ``n*a(m)/m``
shared energy and its own decode terms in closed form, so the rule costs O(sum over entries of m) — one pass
over the log, never over individual steps of a run.

Metered energy. The log gives each segment's metered (possibly noisy) energy but not the clock or share it ran
at. With ``scale="step"`` (default) every segment's logged energy is split in proportion to its law terms:
member i of segment k receives ``logged_k * (e_{i,k} + a(m_k)/m_k * n_k) / law_k``. This is the Shapley
value of the model game whose every segment is rescaled to its logged energy (the game is linear in the
segments), so shares add up to the logged energy exactly, and a coefficient scale error common to a segment
cancels. ``scale="none"`` returns the law's own numbers. ``total_j`` (e.g. the window's metered busy energy)
rescales the result uniformly to that total, as the paper divides the measured energy in proportion to shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from commitenv.attribution.law import StepLaw, StepTable, decompose


@dataclass(frozen=True)
class Attribution:
    """Per-request energy shares (joules), aligned with ``players`` (request slots)."""

    players: np.ndarray
    shares: np.ndarray
    own: np.ndarray | None = None
    shared: np.ndarray | None = None
    se: np.ndarray | None = None  # standard error per request when the shares are a sampled estimate
    method: str = ""

    @property
    def total_j(self) -> float:
        return float(self.shares.sum())

    def as_dict(self) -> dict[int, float]:
        return dict(zip(self.players.tolist(), self.shares.tolist()))

    def of(self, slot: int) -> float:
        idx = np.flatnonzero(self.players == slot)
        if not len(idx):
            raise KeyError(f"slot {slot} is not one of the attributed requests")
        return float(self.shares[idx[0]])

    def normalized(self, total_j: float) -> "Attribution":
        """The same split rescaled to add up to ``total_j``."""
        s = self.shares.sum()
        f = total_j / s if s != 0 else 0.0
        return Attribution(
            self.players,
            self.shares * f,
            None if self.own is None else self.own * f,
            None if self.shared is None else self.shared * f,
            None if self.se is None else self.se * abs(f),
            self.method,
        )


def closed_form(steps: StepTable, *, scale: str = "step", total_j: float | None = None) -> Attribution:
    """Proposition 5.1 on a decomposed log (see the module docstring for ``scale`` and ``total_j``)."""
    f = steps.scale(scale)
    ent = steps.entry_of
    own = np.bincount(steps.member, weights=steps.own_law * f[ent], minlength=steps.n)
    per_member_shared = (f * steps.shared_law / steps.m)[ent]
    shared = np.bincount(steps.member, weights=per_member_shared, minlength=steps.n)
    out = Attribution(steps.players, own + shared, own, shared, None, "closed_form")
    return out if total_j is None else out.normalized(total_j)


def closed_form_from_log(
    log: Sequence,
    prompts,
    law: StepLaw,
    *,
    players: Sequence[int] | None = None,
    scale: str = "step",
    total_j: float | None = None,
) -> Attribution:
    """`closed_form` straight from `StepLogEntry` records (``prompts``: prompt lengths by slot)."""
    return closed_form(decompose(log, prompts, law, players=players), scale=scale, total_j=total_j)


def l1_distance(shares, reference, total_j: float | None = None) -> float:
    """Normalised L1 distance ``sum_i |x_i - r_i| / total`` (total: the reference's sum by default)."""
    x = np.asarray(getattr(shares, "shares", shares), dtype=float)
    r = np.asarray(getattr(reference, "shares", reference), dtype=float)
    if x.shape != r.shape:
        raise ValueError(f"l1_distance: shapes differ ({x.shape} vs {r.shape})")
    t = float(r.sum()) if total_j is None else float(total_j)
    return float(np.abs(x - r).sum() / t) if t else 0.0
