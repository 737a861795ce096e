"""Step-law coefficients of one model instance at a given clock and SM share, flattened for the hot loop."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from commitenv.profiles.schema import Profile


@dataclass(frozen=True, slots=True)
class StepCoeffs:
    """t = tau0 + tau1*P + tau2*n + tau3*L + tau4*A ; E = a + c1*P + c2*A + b*n + kappa*L (see profiles.schema)."""

    tau0: float
    tau1: float
    tau2: float
    tau3: float
    tau4: float
    a: float
    c1: float
    c2: float
    b: float
    kappa: float
    idle_w: float  # active-idle power at this clock (whole GPU)

    def step_time(self, P: float, n: float, L: float, A: float) -> float:
        return self.tau0 + self.tau1 * P + self.tau2 * n + self.tau3 * L + self.tau4 * A

    def step_energy(self, P: float, n: float, L: float, A: float) -> float:
        return self.a + self.c1 * P + self.c2 * A + self.b * n + self.kappa * L


def attention_pairs(chunk: int, history: int) -> int:
    """Prefill attention term A of one chunk of ``chunk`` tokens after ``history`` computed tokens (causal)."""
    return chunk * history + chunk * (chunk + 1) // 2


def coeffs_for(profile: Profile, clock_idx: int, share: float = 1.0) -> StepCoeffs:
    """Coefficients at ``clock_idx`` and SM share ``share``, cached per profile object (a copy of a profile has its
    own entries, dropped when the copy is collected)."""
    key = (clock_idx, round(float(share), 6))
    cache = _CACHE.get(id(profile))
    if cache is None:
        cache = _CACHE[id(profile)] = {}
        weakref.finalize(profile, _CACHE.pop, id(profile), None)
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = _coeffs(profile, clock_idx, key[1])
    return hit


_CACHE: dict[int, dict[tuple[int, float], StepCoeffs]] = {}


def _coeffs(profile: Profile, clock_idx: int, share: float) -> StepCoeffs:
    if not (profile.sm_share.min_share - 1e-12 <= share <= 1.0 + 1e-12):
        raise ValueError(
            f"profile {profile.name}: SM share {share} outside [{profile.sm_share.min_share}, 1.0] (sm_share.min_share)"
        )
    lvl = profile.clocks[clock_idx]
    tl, el = lvl.time, lvl.energy
    fc = share ** (-profile.sm_share.compute_exponent)
    fm = share ** (-profile.sm_share.memory_exponent)
    # Time terms stretch with the share; the dynamic (above-idle) energy of the work is kept, and the idle
    # floor the step carries grows with its duration: E' = E + idle_w * (t' - t) per term.
    idle = lvl.active_idle_w
    t0, t1, t2, t3, t4 = tl.tau0 * fm, tl.tau1 * fc, tl.tau2 * fm, tl.tau3 * fm, tl.tau4 * fc
    return StepCoeffs(
        tau0=t0,
        tau1=t1,
        tau2=t2,
        tau3=t3,
        tau4=t4,
        a=el.a + idle * (t0 - tl.tau0),
        c1=el.c1 + idle * (t1 - tl.tau1),
        c2=el.c2 + idle * (t4 - tl.tau4),
        b=el.b + idle * (t2 - tl.tau2),
        kappa=el.kappa + idle * (t3 - tl.tau3),
        idle_w=idle,
    )
