"""Step-log fields for attribution: decode flags, clock and SM share per segment, and the on_step hook."""

from __future__ import annotations

from helpers.profiles import COLOCATE, toy_profile

from commitenv.sim import EngineOptions, Instance, NoiseSpec, Pool, PoolLayout
from commitenv.workload.table import make_table


def test_log_carries_decode_flags_clock_and_share_and_hook_sees_the_same():
    prof = toy_profile(scheduler=COLOCATE)
    pool = Pool(prof, PoolLayout(((Instance(0, 0.5),),)), EngineOptions(noise=NoiseSpec(0, 0), log_steps=True),
                clock_mhz=500)
    seen = []
    pool.on_step = seen.append
    # prompt 5 (one prefill chunk), output 3 (two decode steps); a second request joins while A decodes
    pool.attach(make_table([0.0, 0.021], [5, 3], [3, 2]))
    pool.run_until(10.0)
    assert seen == pool.log
    first = pool.log[0]
    assert first.slots == (0,) and first.new_tokens == (5,) and first.decode == (False,)
    assert all(e.clock_mhz == 500 and e.share == 0.5 for e in pool.log)
    mixed = [e for e in pool.log if len(e.slots) == 2]
    assert mixed, "the two requests must share a step"
    first_mixed = dict(zip(mixed[0].slots, zip(mixed[0].new_tokens, mixed[0].decode)))
    assert first_mixed[0] == (1, True)  # A decodes
    assert first_mixed[1] == (3, False)  # B's whole prompt is a prefill chunk
    # decode flags agree with token counts: each request has exactly output - 1 decode tokens
    dec_tokens = {0: 0, 1: 0}
    for e in pool.log:
        for slot, k, dec in zip(e.slots, e.new_tokens, e.decode):
            if dec:
                dec_tokens[slot] += k * e.n_steps
    assert dec_tokens == {0: 2, 1: 1}


def test_hook_without_log_list():
    pool = Pool(toy_profile(), PoolLayout.single(1), EngineOptions(noise=NoiseSpec(0, 0)))
    got = []
    pool.on_step = got.append
    pool.attach(make_table([0.0], [4], [4]))
    pool.run_until(5.0)
    assert pool.log is None
    assert sum(e.energy_j for e in got) > 0
    assert sum(k * e.n_steps for e in got for k in e.new_tokens) == 4 + 4 - 1
