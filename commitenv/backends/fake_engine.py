"""`SimEngine`: the `ServingEngine` seam played by the simulator's own replica on the compiled loop's functions
(`commitenv.sim.kernel.stepper`: vLLM V1 scheduling, the profile's step laws) on a virtual clock (or a scaled wall
clock, in a pool of such engines), metering each step into a `FakeGpu`. Steps run one at a time (never in closed-form
runs), so every step is a record, as on the real engine."""

from __future__ import annotations

import numpy as np

from commitenv.backends.clock import Clock
from commitenv.backends.engine import ServingEngine, StepRecord
from commitenv.backends.fake_gpu import FakeGpu
from commitenv.profiles.schema import Profile
from commitenv.sim.kernel.stepper import ReplicaStepper


class SimEngine(ServingEngine):
    """See the module docstring. ``noise_sigma`` draws each step's time and energy factor from a mean-one
    lognormal (seeded), as measured steps scatter around their law."""

    def __init__(self, profile: Profile, gpu: FakeGpu, clock: Clock, *, noise_sigma: float = 0.0,
                 seed: int = 0) -> None:
        self.profile, self.fake, self.clock = profile, gpu, clock
        self.rep = ReplicaStepper(profile, gpu.clock_index_at(clock.now()))
        self.asleep = False
        self.noise_sigma = noise_sigma
        self._rng = np.random.default_rng(seed)
        self._ids: dict[int, str] = {}  # the stepper's request index -> request id, while unfinished
        self.modelled_step_s = 0.0  # the steps' time by the law (noise included), s
        self.step_overrun_s = 0.0  # how much longer they took on the clock (a scaled clock's oversleep), s

    def add_request(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        limit = self.profile.scheduler.context_limit
        if prompt_tokens < 1 or max_tokens < 1 or prompt_tokens + max_tokens > limit:
            raise ValueError(f"request {request_id}: prompt {prompt_tokens} + output {max_tokens} tokens must be >= 1 "
                             f"each and fit the context limit {limit}")
        if self.asleep:
            raise RuntimeError("the engine sleeps: wake() it before adding requests")
        self._ids[self.rep.add(int(prompt_tokens), int(max_tokens), self.clock.now())] = request_id

    def has_work(self) -> bool:
        return self.rep.has_work()

    def step(self) -> StepRecord | None:
        if not self.rep.has_work():
            return None
        t0 = self.clock.now()
        rep = self.rep
        st = rep.start(t0, self.fake.clock_index_at(t0))
        if st is None:
            return None
        ids = self._ids
        preempted = tuple(ids[i] for i in st.preempted)
        fresh = [i for i in st.requests if rep.generated(i) == 0]
        ft = fe = 1.0
        if self.noise_sigma > 0:
            s = self.noise_sigma
            ft, fe = np.exp(s * self._rng.standard_normal(2) - s * s / 2)
        elapsed = st.duration_s * ft
        energy = st.energy_j * fe
        self.fake.begin_step(t0)
        self.clock.sleep(elapsed)  # a virtual clock advances; a scaled one runs the step in (shortened) real time
        self.fake.add_step(t0, t0 + elapsed, energy)  # a scaled clock's oversleep is idle time, metered as such
        took = self.clock.now() - t0
        self.modelled_step_s += elapsed
        self.step_overrun_s += max(took - elapsed, 0.0)
        elapsed = max(took, elapsed)
        done = rep.finish(t0 + elapsed)
        progress = tuple((ids[i], rep.computed(i), rep.generated(i)) for i in st.requests)
        first = tuple(ids[i] for i in fresh if rep.generated(i) >= 1)
        finished = tuple(ids.pop(i) for i in done)
        return StepRecord(t0, elapsed, st.prefill_tokens, st.prefill_pairs, st.decodes, st.decode_context, first,
                          finished, progress, preempted)

    def sleep(self) -> None:
        if self.rep.has_work():
            raise RuntimeError("sleep(): requests are still queued or running")
        self.asleep = True
        self.fake.set_state("standby")

    def wake(self) -> None:
        if not self.asleep:
            return
        self.fake.set_state("active")  # waking: the instance draws active idle while weights come back
        self.clock.sleep(self.profile.latencies.activation_s)
        self.asleep = False


def standalone_sim_engine(profile: Profile, *, noise_sigma: float = 0.0, seed: int = 0) -> SimEngine:
    """A `SimEngine` with its own `FakeGpu` on its own virtual clock: a fake engine that can be built anywhere,
    e.g. in a `commitenv.backends.process_engine.ProcessEngine`'s process."""
    from commitenv.backends.clock import VirtualClock

    clock = VirtualClock()
    return SimEngine(profile, FakeGpu(profile, clock), clock, noise_sigma=noise_sigma, seed=seed)
