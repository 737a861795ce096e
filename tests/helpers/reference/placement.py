"""The reference engine's placement: SM shares, moves, migration and loads on replica and GPU objects."""

from __future__ import annotations

from commitenv.sim.prefix_cache import PrefixCache
from commitenv.sim.states import ACTIVE, DRAINING, EV_LAND, EV_LOAD, LOADING, MOVING, SEG_NONE, STANDBY, WAKING

from helpers.reference.gpu import GPU
from helpers.reference.replica import Replica


class ReferencePlacement:
    """`ReferencePool`'s shares, moves, migration and loading (the checks are `Pool`'s)."""

    def _apply_share(self, t: float, replica: int, share: float, prof) -> None:
        rep = self.replicas[replica]
        rep.share = share
        rep.invalidate_coeffs()  # (from its next step on)

    def _apply_moves(self, t: float, moves: dict[int, int], migrate: str) -> None:
        for replica, gpu in moves.items():
            self._move(self.replicas[replica], self.gpus[gpu], migrate, t)

    def _shares(self) -> list[float]:
        return [r.share for r in self.replicas]

    def _mem_shares(self) -> list[float]:
        return [r.mem_share for r in self.replicas]

    def _targets(self) -> list[int]:
        return [(r.dest if r.state == MOVING else r.gpu).index for r in self.replicas]

    def _move(self, rep: Replica, dest: GPU, migrate: str, t: float) -> None:
        if dest is (rep.dest if rep.state == MOVING else rep.gpu):
            return
        self.moves += 1
        if rep.state == MOVING:
            if dest is rep.gpu:  # called back before it left: it stays and serves as before
                rep.state, rep.dest = (ACTIVE if rep.after_load == ACTIVE else DRAINING), None
                self._floor_changed(rep.gpu, t)
                self._refresh_routable(rep.model)
                self._redistribute(rep.model, t)
                self._flush(t)
            else:
                rep.dest, rep.migrate = dest, migrate
            return
        if rep.state == LOADING:  # the load so far is lost
            rep.dest = dest
            self._detach(rep, t)
            return
        if rep.state == WAKING:
            rep.version += 1  # cancels the wake
        rep.after_load = ACTIVE if rep.state in (ACTIVE, WAKING) else STANDBY
        rep.state, rep.dest, rep.migrate = MOVING, dest, migrate
        self._floor_changed(rep.gpu, t)
        self._refresh_routable(rep.model)
        if rep.seg == SEG_NONE:
            if migrate != "none":
                self._migrate_out(rep, t)
        self._redistribute(rep.model, t)  # its queued requests go elsewhere; idle, it unloads at once
        self._flush(t)

    def _migrate_out(self, rep: Replica, t: float) -> None:
        """Send ``rep``'s requests that its migration mode moves (between steps) to be routed anew after their KV
        transfer; with ``latency_aware``, only those whose predicted remaining time exceeds the transfer time."""
        spec = self.opt.migration
        kvb = rep.profile.model.kv_bytes_per_token
        step_s = 0.0
        if rep.migrate == "latency_aware" and rep.running:
            ctx = sum(r.computed + 1 for r in rep.running)
            step_s = rep.coeffs.step_time(0, len(rep.running), ctx, 0)
        keep, moved = [], []
        for r in rep.running:
            nbytes = r.computed * kvb
            if rep.migrate == "latency_aware":
                pred = self._seen(r)[0]
                left = max(pred - r.generated, 1) + -(-(r.prompt - min(r.computed, r.prompt)) // rep.budget)
                if not left * step_s > spec.transfer_s(nbytes):
                    keep.append(r)
                    continue
            moved.append((r, nbytes))
        rep.running = keep
        for r in [r for r in rep.waiting if r.started]:  # preempted (no KV left) or landed here, not yet admitted
            moved.append((r, r.computed * kvb))
        rep.waiting = type(rep.waiting)(r for r in rep.waiting if not r.started)
        for r, nbytes in moved:
            rep._release(r)
            r.hashes, r.replica = (), -1  # its KV arrives as private blocks
            if nbytes:
                e = spec.transfer_j(nbytes)
                rep.gpu.book(e, 0.0)
                self.migration_j += e
                self.migration_bytes += nbytes
            self.migrated += 1
            land = t + (spec.transfer_s(nbytes) if nbytes else 0.0)
            self.transit[r.slot] = (land, r)
            self._push(land, EV_LAND, r.slot, 0)
        rep.unf = len(rep.running) + len(rep.waiting)

    def _detach(self, rep: Replica, t: float) -> None:
        """Take ``rep`` (idle) off its GPU and cold-start it on its destination (``rep.dest``); instances waiting
        for the memory it held on the GPU it left begin their loads, and loaded ones waiting for SMs check again at
        ``t`` (a load event each, after what is under way: a departure never starts service in the middle of the
        routing or start that caused it)."""
        src, dest = rep.gpu, rep.dest
        rep.dest = None
        src.replicas.remove(rep)
        self._begin_load(rep, dest, t)
        self._floor_changed(src, t)
        for r in list(src.replicas):
            if r.state == LOADING and r.load_wait:
                self._start_load(r, t)
        for r in src.replicas:
            if r.state == LOADING and r.load_ready:
                self._push(t, EV_LOAD, r.index, r.version)

    def _begin_load(self, rep: Replica, dest: GPU, t: float) -> None:
        """Put ``rep`` on ``dest`` with a fresh KV cache; its cold start begins once the memory it reserves is free
        there (a departing instance keeps its memory until it leaves)."""
        rep.gpu = dest
        dest.replicas.append(rep)
        rep.invalidate_coeffs()
        rep.free_blocks = rep.cap_blocks  # a fresh KV cache (an empty prefix cache)
        if rep.pcache is not None:
            rep.pcache = PrefixCache(rep.pcache.block_tokens, rep.bs, rep.cap_blocks)
        rep.state, rep.load_ready, rep.load_wait = LOADING, False, True
        rep.version += 1
        self._start_load(rep, t)

    def _start_load(self, rep: Replica, t: float) -> None:
        """Begin ``rep``'s cold start (the profile's ``latencies.load_s`` at ``load_w``) if its memory share fits
        beside what the instances on its GPU hold (those still waiting for memory hold none)."""
        held = sum(r.mem_share for r in rep.gpu.replicas if r is not rep and not (r.state == LOADING and r.load_wait))
        if held + rep.mem_share > 1.0 + 1e-9:
            return
        rep.load_wait = False
        rep.load_t = t + rep.profile.latencies.load_s
        self.cold_starts += 1
        self._floor_changed(rep.gpu, t)
        self._push(rep.load_t, EV_LOAD, rep.index, rep.version)

    def _loaded(self, rep: Replica, t: float) -> None:
        """``rep``'s cold start is over: it serves (or stands by) once the SMs of its share are free."""
        busy = sum(r.share for r in rep.gpu.replicas if r is not rep and r.state in (ACTIVE, DRAINING, MOVING, WAKING))
        if busy + rep.share > 1.0 + 1e-9:
            if not rep.load_ready:
                rep.load_ready = True
                self._floor_changed(rep.gpu, t)
            return
        rep.state, rep.load_ready = rep.after_load, False
        self._floor_changed(rep.gpu, t)
        if rep.state == ACTIVE:
            self._refresh_routable(rep.model)
            self._redistribute(rep.model, t)
            self._flush(t)


