"""`SimEngine`: the `ServingEngine` seam played by the simulator's own replica (vLLM V1 scheduling, the profile's
step laws) on a virtual clock (or a scaled wall clock, in a pool of such engines), metering each step into a `FakeGpu`. Steps run one at a time (never in closed-form
runs), so every step is a record, as on the real engine."""

from __future__ import annotations

import math

import numpy as np

from commitenv.backends.clock import Clock
from commitenv.backends.engine import ServingEngine, StepRecord
from commitenv.backends.fake_gpu import FakeGpu
from commitenv.profiles.schema import Profile
from commitenv.sim.gpu import GPU
from commitenv.sim.replica import Replica, batch_terms
from commitenv.sim.states import ACTIVE, STANDBY
from commitenv.sim.request import Req


class SimEngine(ServingEngine):
    """See the module docstring. ``noise_sigma`` draws each step's time and energy factor from a mean-one
    lognormal (seeded), as measured steps scatter around their law."""

    def __init__(self, profile: Profile, gpu: FakeGpu, clock: Clock, *, noise_sigma: float = 0.0,
                 seed: int = 0) -> None:
        self.profile, self.fake, self.clock = profile, gpu, clock
        self._gpu = GPU(0, gpu.clock_index_at(clock.now()))
        self.rep = Replica(0, self._gpu, profile)
        self._gpu.replicas = [self.rep]
        self.noise_sigma = noise_sigma
        self._rng = np.random.default_rng(seed)
        self._ids: dict[int, str] = {}
        self._slot = 0
        self.modelled_step_s = 0.0  # the steps' time by the law (noise included), s
        self.step_overrun_s = 0.0  # how much longer they took on the clock (a scaled clock's oversleep), s

    def add_request(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        limit = self.profile.scheduler.context_limit
        if prompt_tokens < 1 or max_tokens < 1 or prompt_tokens + max_tokens > limit:
            raise ValueError(f"request {request_id}: prompt {prompt_tokens} + output {max_tokens} tokens must be >= 1 "
                             f"each and fit the context limit {limit}")
        if self.rep.state == STANDBY:
            raise RuntimeError("the engine sleeps: wake() it before adding requests")
        r = Req(self._slot, self.clock.now(), int(prompt_tokens), int(max_tokens), math.inf)
        r.replica = 0
        self._ids[self._slot] = request_id
        self._slot += 1
        self.rep.waiting.append(r)
        self.rep.unf += 1

    def has_work(self) -> bool:
        return self.rep.has_work()

    def step(self) -> StepRecord | None:
        if not self.rep.has_work():
            return None
        t0 = self.clock.now()
        idx = self.fake.clock_index_at(t0)
        if idx != self._gpu.clock_idx:
            self._gpu.clock_idx = idx
            self.rep.invalidate_coeffs()
        rep = self.rep
        before = {r.slot: r.preemptions for r in (*rep.running, *rep.waiting)}
        if not rep.start(t0, None, False, False):
            return None
        preempted = tuple(self._ids[r.slot] for r in rep.waiting if r.preemptions > before.get(r.slot, 0))
        P, A, n, L = batch_terms(rep.batch)
        batch = [r for r, _ in rep.batch]
        fresh = [r for r in batch if r.generated == 0]
        ft = fe = 1.0
        if self.noise_sigma > 0:
            s = self.noise_sigma
            ft, fe = np.exp(s * self._rng.standard_normal(2) - s * s / 2)
        elapsed = (rep.t1 - t0) * ft
        energy = rep.seg_energy * fe
        self.fake.begin_step(t0)
        self.clock.sleep(elapsed)  # a virtual clock advances; a scaled one runs the step in (shortened) real time
        self.fake.add_step(t0, t0 + elapsed, energy)  # a scaled clock's oversleep is idle time, metered as such
        took = self.clock.now() - t0
        self.modelled_step_s += elapsed
        self.step_overrun_s += max(took - elapsed, 0.0)
        elapsed = max(took, elapsed)
        rep.t1 = t0 + elapsed
        done = rep.finish()
        progress = tuple((self._ids[r.slot], r.computed, r.generated) for r in batch)
        first = tuple(self._ids[r.slot] for r in fresh if r.generated >= 1)
        finished = tuple(self._ids.pop(r.slot) for r in done)
        return StepRecord(t0, elapsed, P, A, n, L, first, finished, progress, preempted)

    def sleep(self) -> None:
        if self.rep.has_work():
            raise RuntimeError("sleep(): requests are still queued or running")
        self.rep.state = STANDBY
        self.fake.set_state("standby")

    def wake(self) -> None:
        if self.rep.state == ACTIVE:
            return
        self.fake.set_state("active")  # waking: the instance draws active idle while weights come back
        self.clock.sleep(self.profile.latencies.activation_s)
        self.rep.state = ACTIVE


def standalone_sim_engine(profile: Profile, *, noise_sigma: float = 0.0, seed: int = 0) -> SimEngine:
    """A `SimEngine` with its own `FakeGpu` on its own virtual clock: a fake engine that can be built anywhere,
    e.g. in a `commitenv.backends.process_engine.ProcessEngine`'s process."""
    from commitenv.backends.clock import VirtualClock

    clock = VirtualClock()
    return SimEngine(profile, FakeGpu(profile, clock), clock, noise_sigma=noise_sigma, seed=seed)
