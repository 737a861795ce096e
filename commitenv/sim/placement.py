"""Placement actions: SM shares and moving replicas between GPUs (with or without migrating their requests), checked
against the shares and memory each GPU holds; the compiled loop carries them out (`commitenv.sim.kernel.actuate`,
`commitenv.sim.kernel.lifecycle`)."""

from __future__ import annotations

from typing import Iterable

from commitenv.sim import memory
from commitenv.sim.migration import MIGRATE_MODES


class Placement:
    """`Pool`'s SM shares, moves, migration and loading (mixed into `Pool`)."""

    def set_share(self, t: float, replica: int, share: float) -> None:
        """Give ``replica`` a new SM share from its next step on (shares on a GPU must sum to <= 1)."""
        if t < self.now - 1e-9:
            raise ValueError(f"set_share at t={t} precedes the engine clock {self.now}")
        models = self.replica_models
        if not 0 <= replica < len(models):
            raise ValueError(f"replica index {replica} outside 0..{len(models) - 1}")
        prof = self.profiles[models[replica]]
        mn = prof.sm_share.min_share
        if not mn <= share <= 1.0:
            raise ValueError(f"sm share of replica {replica}: expected {mn}..1.0, got {share}")
        target = self._targets()
        g = target[replica]
        cur = self._shares()
        others = [x for k, x in enumerate(cur) if k != replica and target[k] == g]
        total = share + sum(others)
        if total > 1.0 + 1e-9:
            raise ValueError(f"sm shares on GPU {g} would sum to {total:.3f} > 1")
        self._apply_share(t, replica, share, prof)

    # ================================================================================ placement and migration
    def move(self, t: float, moves: dict[int, int], migrate: str = "none") -> None:
        """Move instances (``{replica: GPU}``) from ``t``: each takes no new requests (its queued ones are routed
        anew), its running requests finish where they are or travel with their KV cache to another active instance
        of the model (``migrate``, `commitenv.sim.migration`), then it unloads and cold-starts on its GPU (the
        profile's ``latencies.load_s`` at ``load_w``) and serves again (or stands by, as ``set_active`` says). The
        SM shares of every GPU's staying and arriving instances must sum to <= 1 once all ``moves`` are made."""
        if t < self.now - 1e-9:
            raise ValueError(f"move at t={t} precedes the engine clock {self.now}")
        if migrate not in MIGRATE_MODES:
            raise ValueError(f"move: migrate must be one of {MIGRATE_MODES}, got {migrate!r}")
        models = self.replica_models
        target = dict(enumerate(self._targets()))
        n_gpus = len(self.layout.gpus)
        for replica, gpu in moves.items():
            if not 0 <= replica < len(models):
                raise ValueError(f"move: replica index {replica} outside 0..{len(models) - 1}")
            if not 0 <= gpu < n_gpus:
                raise ValueError(f"move: GPU index {gpu} outside 0..{n_gpus - 1}")
            prof = self.profiles[models[replica]]
            if gpu != target[replica] and prof.latencies.load_s is None:
                raise ValueError(f"move: profile {prof.name} has no cold-start figures (latencies.load_s, load_w)")
            target[replica] = gpu
        shares = self._shares()
        for g in set(moves.values()):
            held = sum(x for k, x in enumerate(shares) if target[k] == g)
            if held > 1.0 + 1e-9:
                raise ValueError(f"move: the instances on GPU {g} would hold {held:.3f} > 1 of its SMs")
        self.check_memory(target, moves.values())
        self._apply_moves(t, moves, migrate)

    # (the state these checks read, and the actions carried out, on the kernel's arrays)
    def _targets(self) -> list[int]:
        """The GPU each replica is on or, moving, goes to."""
        return self._ks.targets().tolist()

    def _shares(self) -> list[float]:
        return self._ks.shares().tolist()

    def _mem_shares(self) -> list[float]:
        return self._ks.mem_shares().tolist()

    def _apply_share(self, t: float, replica: int, share: float, prof) -> None:
        self._ks.set_share(t, replica, share, prof)

    def _apply_moves(self, t: float, moves: dict[int, int], migrate: str) -> None:
        for replica, gpu in moves.items():
            self.moves += self._ks.move(t, replica, gpu, migrate, self)
        self.sync_from_kernel(self._ks)

    def check_memory(self, target: dict[int, int], gpus: Iterable[int]) -> None:
        """Raise when the memory shares of the instances GPU g (each of ``gpus``) would host under ``target``
        ({replica: GPU}) sum to more than 1: an instance keeps the memory it reserved when first placed
        (`commitenv.sim.memory`). Changes nothing."""
        mem = self._mem_shares()
        for g in set(gpus):
            held = sum(m for k, m in enumerate(mem) if target[k] == g)
            if held > 1.0 + 1e-9:
                raise memory.PlacementMemoryError(
                    f"move: the instances on GPU {g} would reserve {held:.3f} > 1 of its memory (an instance keeps the "
                    "memory share it was placed with; SM share changes do not move memory)")
