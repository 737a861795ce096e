"""The toy profile with round coefficients, so engine cases can be computed by hand, and its variants."""

from __future__ import annotations

from commitenv.profiles.schema import Profile
from commitenv.sim.memory import GPU_MEMORY_UTILIZATION


def toy_profile(**over) -> Profile:
    """Two clock levels; at the top clock: t = 0.01 + 0.001 P + 0.0001 n + 0.00001 L (tau4 = 0),
    E = 1 + 0.1 P + 0.01 n + 0.001 L; idle 50 W (active and draining), standby 20 W."""
    sched = dict(token_budget=8, max_seqs=4, context_limit=64, block_size=4, kv_capacity_tokens=64)
    sched.update(over.pop("scheduler", {}))
    top = dict(
        mhz=1000,
        time=dict(tau0=0.01, tau1=0.001, tau2=0.0001, tau3=0.00001, tau4=0.0),
        energy=dict(a=1.0, c1=0.1, c2=0.0, b=0.01, kappa=0.001),
        active_idle_w=50.0,
        draining_idle_w=50.0,
    )
    low = dict(
        mhz=500,
        time=dict(tau0=0.012, tau1=0.002, tau2=0.0001, tau3=0.000012, tau4=0.0),
        energy=dict(a=0.8, c1=0.12, c2=0.0, b=0.008, kappa=0.0009),
        active_idle_w=40.0,
        draining_idle_w=40.0,
    )
    raw = dict(
        name="toy",
        gpu=dict(name="toy-gpu", memory_gb=1, tdp_w=100, memory_bandwidth_gbs=100),
        model=dict(name="toy-model", params_b=1, weight_gb=1, kv_bytes_per_token=1),
        clocks=[low, top],
        reference_clock_mhz=1000,
        standby_w=20.0,
        scheduler=sched,
        latencies=dict(clock_change_s=0.0, activation_s=1.0),
        sm_share=dict(compute_exponent=1.0, memory_exponent=0.5, min_share=0.1),
        sources={"gpu": "test", "model": "test", "clocks": "test", "reference_clock_mhz": "test", "standby_w": "test",
                 "scheduler": "test", "latencies": "test", "sm_share": "test"},
    )
    raw.update(over)
    if "gpu" not in over:  # memory consistent with the KV capacity: footprint 1/64 of usable (`commitenv.sim.memory`)
        kvb = raw["model"]["kv_bytes_per_token"]
        raw["gpu"] = dict(raw["gpu"], memory_gb=sched["kv_capacity_tokens"] * kvb * 64 / 63 / GPU_MEMORY_UTILIZATION / 1e9)
    return Profile.model_validate(raw)


# scheduler limits of a toy instance that can share its GPU: its KV cache at share 1 holds 16 requests at the context
# limit, so down to the toy's minimum SM share of 0.1 it still holds one (`commitenv.sim.memory`)
COLOCATE = dict(kv_capacity_tokens=1024)


def attn_toy_profile(**over) -> Profile:
    """The toy profile whose clocks also charge the prefill attention term (top clock: tau4 = 1e-6 s,
    c2 = 1e-4 J per attention pair)."""
    low = dict(mhz=500, time=dict(tau0=0.012, tau1=0.002, tau2=0.0001, tau3=0.000012, tau4=2e-6),
               energy=dict(a=0.8, c1=0.12, c2=0.0002, b=0.008, kappa=0.0009), active_idle_w=40.0,
               draining_idle_w=40.0)
    top = dict(mhz=1000, time=dict(tau0=0.01, tau1=0.001, tau2=0.0001, tau3=0.00001, tau4=1e-6),
               energy=dict(a=1.0, c1=0.1, c2=0.0001, b=0.01, kappa=0.001), active_idle_w=50.0,
               draining_idle_w=50.0)
    return toy_profile(clocks=[low, top], **over)
