"""Controllers and controller contexts the test files share."""

from __future__ import annotations

from commitenv_controllers import Controller, ControllerContext


class LowAndSlow(Controller):
    """One replica at the lowest clock, every interval."""

    name = "low-and-slow"

    def act(self, observation, info):
        return {"active": 1, "clock": 0}


class NoProbe:
    """A probe that offers nothing (a controller context's stand-in)."""


def controller_context(K: int = 4, probe=None) -> ControllerContext:
    """A one-hour context of 4 replicas at 500/1000 MHz with ``K`` intervals of 900 s (ePACT's unit cases)."""
    return ControllerContext(scenario="x", n_replicas=4, clocks_mhz=(500, 1000), reference_clock_mhz=1000,
                             interval_s=900.0, intervals_per_hour=K, horizon_hours=1, commitments_j=(1.0,),
                             lambda_plus=2.0, lambda_minus=1.0, alpha=3.0, epsilon=0.01, actuation_delay_s=0.0,
                             probe=probe if probe is not None else NoProbe())
