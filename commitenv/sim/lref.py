"""Reference latency L_ref: a request's standalone service time on an isolated replica at the reference
configuration (top clock, full SM share), in closed form over the chunked prefill and the decode steps."""

from __future__ import annotations

import numpy as np

from commitenv.profiles.schema import Profile
from commitenv.sim.coeffs import coeffs_for


def reference_latency(profile: Profile, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Standalone latency (s) for each (prompt, output) pair, vectorised.

    Prefill runs in ceil(p/B) chunks of the token budget B; the attention pairs of a causal prompt sum to
    p(p+1)/2 however it is chunked. The last chunk emits the first token; each of the o-1 decode steps j
    attends over p+j keys.
    """
    c = coeffs_for(profile, profile.reference_clock_index, 1.0)
    B = profile.scheduler.token_budget
    p = np.asarray(prompt, dtype=np.float64)
    o = np.asarray(output, dtype=np.float64)
    chunks = np.ceil(p / B)
    pre = chunks * c.tau0 + c.tau1 * p + c.tau4 * p * (p + 1) / 2
    d = np.maximum(o - 1, 0)
    dec = d * (c.tau0 + c.tau2) + c.tau3 * (d * p + d * (d + 1) / 2)
    return pre + dec
