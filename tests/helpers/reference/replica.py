"""The reference engine's model replica with vLLM V1 scheduling: running first, then waiting in arrival order, chunked
prefill, KV blocks with preemption by recompute, the prefix cache. It holds at most one step in flight and schedules
every step afresh (no closed-form decode runs): the plainest statement of the semantics the compiled loop keeps.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from commitenv.profiles.schema import Profile
from commitenv.sim.coeffs import StepCoeffs, coeffs_for
from commitenv.sim.local import check_plan
from commitenv.sim.prefix_cache import PrefixCache
from commitenv.sim.records import SegmentLog
from commitenv.sim.request import Req
from commitenv.sim.states import ACTIVE, SEG_NONE, SEG_STEP

if TYPE_CHECKING:  # pragma: no cover
    from helpers.reference.gpu import GPU


def batch_terms(batch: list[tuple[Req, int]], flags: list[bool] | None = None) -> tuple[int, int, int, int]:
    """The step laws' terms of a scheduled batch of (request, new tokens), before it runs: prefill tokens P,
    prefill attention pairs A, decoding requests n and summed decode context L. With ``flags`` (a list, for the
    step log), appends per entry whether it decodes (one new token of a request whose prompt and earlier tokens
    are all computed); without, builds nothing per entry (the engine's hot path)."""
    P = A = n = L = 0
    for r, k in batch:
        if k == 1 and r.generated >= 1 and r.computed + 1 == r.prompt + r.generated:
            n += 1
            L += r.computed + 1
            if flags is not None:
                flags.append(True)
        else:
            if flags is not None:
                flags.append(False)
            P += k
            A += k * r.computed + k * (k + 1) // 2
    return P, A, n, L


class Replica:
    """A model instance on a GPU: scheduler queues, KV blocks, lifecycle state and the segment in flight."""

    def __init__(self, index: int, gpu: "GPU", profile: Profile, model: int = 0, share: float = 1.0) -> None:
        self.index = index
        self.gpu = gpu
        self.profile = profile
        self.clock_levels = tuple(profile.clock_mhz)  # its GPU's clock levels in MHz (what a local policy sees)
        self.model = model
        self.share = share
        sch = profile.scheduler
        self.budget = sch.token_budget
        self.max_seqs = sch.max_seqs
        self.bs = sch.block_size
        self.cap_blocks = sch.kv_capacity_tokens // sch.block_size
        self.reserve_full = sch.reserve_full_sequence
        self.free_blocks = self.cap_blocks
        self.mem_share = share  # the part of its GPU's usable memory it reserves (`commitenv.sim.memory`)
        self.running: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.unf = 0  # len(running) + len(waiting), kept up to date for the router
        self.state = ACTIVE
        self.wake_t = 0.0
        self.dest: "GPU | None" = None  # MOVING: the GPU it goes to
        self.migrate = "none"  # MOVING: what happens to its running requests (commitenv.sim.migration)
        self.after_load = ACTIVE  # MOVING / LOADING: the state it takes once loaded (ACTIVE or STANDBY)
        self.load_t = 0.0  # LOADING: when the cold start ends
        self.load_ready = False  # LOADING: loaded, waiting for SMs the GPU's departing instances still use
        self.load_wait = False  # LOADING: not begun, waiting for memory the GPU's departing instances still hold
        self.version = 0  # bumps whenever the pending heap entry of this replica becomes stale
        # segment in flight
        self.seg = SEG_NONE
        self.t0 = 0.0
        self.t1 = 0.0
        self.batch: list[tuple[Req, int]] = []  # SEG_STEP: (request, new tokens)
        self.ft = 1.0  # noise factors of the segment (time, energy)
        self.fe = 1.0
        self.seg_energy = 0.0  # energy of the whole segment (J)
        self.seg_floor_w = 0.0  # GPU floor power the segment is charged against since seg_floor_t
        self.seg_floor_t = 0.0
        self.seg_floor_acc = 0.0  # floor energy charged over [t0, seg_floor_t)
        self.seg_log: SegmentLog | None = None
        self._coeffs: StepCoeffs | None = None
        self.pending_start = False  # queued to start a step once every event at the current time is in
        self.pcache: PrefixCache | None = None  # prefix block cache (only when the workload has hash blocks)

    # ----------------------------------------------------------------------------------------- helpers
    @property
    def coeffs(self) -> StepCoeffs:
        c = self._coeffs
        if c is None:
            c = self._coeffs = coeffs_for(self.profile, self.gpu.clock_idx, self.share)
        return c

    def invalidate_coeffs(self) -> None:
        self._coeffs = None

    @property
    def unfinished(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def busy(self) -> bool:
        return self.seg != SEG_NONE

    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    # ----------------------------------------------------------------------------------------- scheduling
    def _release(self, r: Req) -> None:
        """Free a request's KV: private (tail) blocks at once, then shared prefix entries (deepest first) whose
        last holder leaves."""
        pc = self.pcache
        if pc is not None:
            private = r.blocks - pc.per_entry * len(r.prefix)
            pc.give(private)
            self.free_blocks += private
            if r.prefix:
                self.free_blocks += pc.release(r.prefix)
                r.prefix = []
        else:
            self.free_blocks += r.blocks
        r.blocks = 0
        r.pfx_next = 0

    def _alloc(self, n: int) -> None:
        """Take ``n`` free blocks (the caller checked ``n <= free_blocks``), from the prefix cache's free queue
        when there is one (the scheduler inlines the no-cache case)."""
        if self.pcache is not None:
            self.pcache.take(n)
        self.free_blocks -= n

    def _register(self, r: Req, upto: int) -> None:
        """Cache the shareable blocks of ``r`` that the scheduled tokens (up to ``upto``) complete."""
        hs = r.hashes
        j = r.pfx_next
        bt = self.pcache.block_tokens
        while j < len(hs) and (j + 1) * bt <= upto:
            e = self.pcache.register(hs[j])
            if e is not None:
                r.prefix.append(e)
            j += 1
        r.pfx_next = j

    def _preempt(self, r: Req) -> None:
        """vLLM recompute preemption: free the request's blocks, drop its computed tokens, queue it first."""
        self._release(r)
        r.computed = 0
        r.preemptions += 1
        self.waiting.appendleft(r)

    def _admission(self, r: Req, budget: int) -> tuple[int, int, list | None, int] | None:
        """How waiting request ``r`` would be admitted with ``budget`` tokens left: (tokens, new KV blocks, prefix
        hit or None, blocks the hit takes out of the free queue); None when its blocks (or, reserving full
        sequences, its whole sequence) do not fit."""
        pc = self.pcache
        bs = self.bs
        if pc is not None and r.hashes and r.computed == 0:
            hit, cost = pc.lookup(r.hashes)
            h = len(hit) * pc.block_tokens
            k = min(r.prompt + r.generated - h, budget)
            need = -(-(h + k) // bs) - len(hit) * pc.per_entry
            if need + cost > self.free_blocks:
                return None
            if self.reserve_full and -(-(r.prompt + r.generated) // bs) - len(hit) * pc.per_entry + cost > \
                    self.free_blocks:
                return None
            return k, need, hit, cost
        k = min(r.prompt + r.generated - r.computed, budget)
        need = -(-(r.computed + k) // bs) - r.blocks
        if need > self.free_blocks:
            return None
        if self.reserve_full and -(-(r.prompt + r.generated) // bs) - r.blocks > self.free_blocks:
            return None
        return k, need, None, 0

    def _admit(self, r: Req, k: int, need: int, hit: list | None, cost: int) -> int:
        """Move ``r`` (already out of the waiting queue) into the running batch as `_admission` planned: take its
        prefix hit, allocate its blocks, register the blocks it completes. Returns its tokens ``k``."""
        pc = self.pcache
        if hit:
            pc.acquire(hit)
            self.free_blocks -= cost
            r.prefix = hit
            r.computed = len(hit) * pc.block_tokens
            r.blocks = len(hit) * pc.per_entry
            r.pfx_next = len(hit)
        self.running.append(r)
        r.started = True
        if pc is None:
            self.free_blocks -= need
        else:
            self._alloc(need)
        r.blocks += need
        if hit is not None and r.pfx_next < len(r.hashes):
            self._register(r, r.computed + k)
        return k

    def schedule(self) -> tuple[list[tuple[Req, int]], bool]:
        """Form the next step's batch. Returns (batch, preempted).

        Running requests first (decode tokens and continuing prefill chunks, within the token budget);
        on a KV shortage the newest running request is preempted. Waiting requests are admitted in order
        only when nothing was preempted this step (vLLM V1), while budget, sequence cap and KV blocks allow.
        Whatever stops admission here (budget, sequence cap, KV shortage, draining) persists while the batch
        only decodes, which is what makes a closed-form decode run exact.
        """
        budget = self.budget
        bs = self.bs
        pc = self.pcache
        batch: list[tuple[Req, int]] = []
        running = self.running
        preempted = False
        for r in running:  # (a preemption pops from the end: the iteration then stops there)
            if budget <= 0:
                break
            k = r.prompt + r.generated - r.computed
            if k > budget:
                k = budget
            need = -(-(r.computed + k) // bs) - r.blocks
            scheduled = True
            while need > self.free_blocks:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is r:
                    scheduled = False
                    break
            if not scheduled:
                break
            # (allocation inlined on this hot path; `schedule_ordered` repeats these lines for planned steps)
            if pc is None:
                self.free_blocks -= need
            else:
                self._alloc(need)
            r.blocks += need
            if r.pfx_next < len(r.hashes):
                self._register(r, r.computed + k)
            batch.append((r, k))
            budget -= k
        if preempted:
            return batch, True
        waiting = self.waiting
        draining = self.state != ACTIVE
        while waiting and budget > 0 and len(running) < self.max_seqs:
            r = waiting[0]
            if draining and not r.started:
                break  # a draining replica admits no new work (queued ones were moved away)
            fit = self._admission(r, budget)
            if fit is None:
                break
            waiting.popleft()
            k = self._admit(r, *fit)
            batch.append((r, k))
            budget -= k
        return batch, False

    def schedule_ordered(self, order: tuple[int, ...], cap: int = 0) -> list[tuple[Req, int]]:
        """Form the next step's batch from a local policy's plan (`commitenv.sim.local`): the listed slots in
        order, each taking ``min(tokens left, budget left)`` tokens if its KV blocks (and, when waiting, the
        sequence cap) allow, else skipped; never preempts. Raises ValueError for a slot the replica does not hold
        or one listed twice."""
        held = {r.slot: r for r in self.running}
        queued = {r.slot: r for r in self.waiting}
        check_plan(order, held.keys() | queued.keys(), self.index)  # (the whole plan, before anything is scheduled)
        budget = cap if 0 < cap < self.budget else self.budget
        bs = self.bs
        pc = self.pcache
        batch: list[tuple[Req, int]] = []
        admitted: set[int] = set()
        draining = self.state != ACTIVE
        for slot in order:
            if budget <= 0:
                break
            r = held.get(slot)
            if r is not None:
                k = min(r.prompt + r.generated - r.computed, budget)
                need = -(-(r.computed + k) // bs) - r.blocks
                if need > self.free_blocks:
                    continue
                if pc is None:
                    self.free_blocks -= need
                else:
                    self._alloc(need)
                r.blocks += need
                if r.pfx_next < len(r.hashes):
                    self._register(r, r.computed + k)
                batch.append((r, k))
                budget -= k
                continue
            r = queued[slot]
            if len(self.running) >= self.max_seqs or (draining and not r.started):
                continue
            fit = self._admission(r, budget)
            if fit is None:
                continue
            admitted.add(slot)
            k = self._admit(r, *fit)
            batch.append((r, k))
            budget -= k
        if admitted:
            self.waiting = deque(r for r in self.waiting if r.slot not in admitted)
        return batch

    # ----------------------------------------------------------------------------------------- segments
    def start(self, t: float, noise, record: bool, plan: tuple[tuple[int, ...], int] | None = None) -> bool:
        """Schedule and start the next segment at time ``t`` (from a local policy's ``plan``, its order and token
        budget, when given; the vLLM scheduler when it fills nothing). Returns False when there is nothing to run."""
        batch: list[tuple[Req, int]] = []
        preempted = False
        if plan is not None:
            batch = self.schedule_ordered(*plan)
        if not batch:
            batch, preempted = self.schedule()
        if not batch:
            self.seg = SEG_NONE
            return False
        c = self.coeffs
        flags: list[bool] | None = [] if record else None
        self.seg_log = None  # (set below when recording: an unrecorded segment carries no entry, not a stale one)
        P, A, n, L = batch_terms(batch, flags)
        ft, fe, _ = noise.draw_for(self, t) if noise is not None else (1.0, 1.0, math.inf)
        self.ft, self.fe = ft, fe
        self.t0 = t
        self.seg_floor_w = self.gpu.floor_w
        self.seg_floor_t = t
        self.seg_floor_acc = 0.0
        dt = ft * c.step_time(P, n, L, A)
        self.seg = SEG_STEP
        self.batch = batch
        self.t1 = t + dt
        self.seg_energy = fe * c.step_energy(P, n, L, A)
        if record:
            self.seg_log = SegmentLog(tuple([r.slot for r, _ in batch]), tuple([k for _, k in batch]),
                                      tuple([r.computed for r, _ in batch]), tuple(flags),
                                      self.profile.clocks[self.gpu.clock_idx].mhz, self.share)
        return True

    def floor_part(self, t: float) -> float:
        """GPU floor energy the segment is charged against over [t0, t] (the rest of its energy is dynamic)."""
        return self.seg_floor_acc + self.seg_floor_w * (t - self.seg_floor_t)

    def finish(self) -> list[Req]:
        """Apply the segment's progress at its end time; returns the requests that completed."""
        done: list[Req] = []
        if self.seg == SEG_STEP:
            for r, k in self.batch:
                r.computed += k
                if r.computed >= r.prompt + r.generated:
                    r.generated += 1
                    if r.first_t < 0:
                        r.first_t = self.t1
                    else:
                        r.max_gap = max(r.max_gap, self.t1 - r.last_t)
                    r.last_t = self.t1
                    if r.generated >= r.out:
                        done.append(r)
            self.batch = []
        if done:
            ids = {id(r) for r in done}
            self.running = [r for r in self.running if id(r) not in ids]
            self.unf -= len(done)
            for r in done:
                self._release(r)
        self.seg = SEG_NONE
        return done

    def energy_until(self, t: float) -> float:
        """Energy of the in-flight segment between its start and ``t`` (steps are metered linearly in time)."""
        if self.seg == SEG_NONE or t <= self.t0:
            return 0.0
        if t >= self.t1:
            return self.seg_energy
        return self.seg_energy * (t - self.t0) / (self.t1 - self.t0)

    # ----------------------------------------------------------------------------------------- copies
    def clone_into(self, other: "Replica", reqmap: dict[int, Req], *, nominal: bool = False, now: float = 0.0,
                   energy_factor: float = 1.0) -> None:
        """Copy queue, KV and segment state into ``other`` (a replica of a what-if pool). With ``nominal`` the
        segment in flight is restated at the nominal profile (time and energy factors one; it cannot end before
        ``now``), so a copy carries none of the truth's factors."""
        other.cap_blocks, other.mem_share = self.cap_blocks, self.mem_share
        other.free_blocks = self.free_blocks
        if self.pcache is not None:
            other.pcache, emap = self.pcache.clone()
            for r in self.running:
                if r.prefix:
                    reqmap[r.slot].prefix = [emap[e.h] for e in r.prefix]
        other.running = [reqmap[r.slot] for r in self.running]
        other.waiting = deque(reqmap[r.slot] for r in self.waiting)
        other.unf = len(other.running) + len(other.waiting)
        other.state = self.state
        other.share = self.share
        other.migrate, other.after_load = self.migrate, self.after_load
        other.load_t, other.load_ready, other.load_wait = self.load_t, self.load_ready, self.load_wait
        other.seg = self.seg
        other.t0, other.t1 = self.t0, self.t1
        other.batch = [(reqmap[r.slot], k) for r, k in self.batch]
        other.ft, other.fe = self.ft, self.fe
        other.seg_energy = self.seg_energy
        other.seg_floor_w = self.seg_floor_w
        other.seg_floor_t = self.seg_floor_t
        other.seg_floor_acc = self.seg_floor_acc
        other._coeffs = None
        if nominal:
            other.ft, other.fe = 1.0, energy_factor
            if self.seg != SEG_NONE:
                other.seg_energy = self.seg_energy / self.fe * energy_factor
                other.t1 = max(self.t0 + (self.t1 - self.t0) / self.ft, now)
                other.seg_floor_w = self.seg_floor_w / self.gpu.power_factor * energy_factor
                other.seg_floor_acc = self.seg_floor_acc / self.gpu.power_factor * energy_factor
            else:  # an idle replica's last segment says nothing a copy may know
                other.seg_energy = other.seg_floor_w = other.seg_floor_acc = 0.0
                other.t0 = other.t1 = other.seg_floor_t = now
