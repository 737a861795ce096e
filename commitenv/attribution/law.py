"""The energy law applied to a step log: each logged segment split into a shared part and per-request own parts.

StepSplit (section 5.1) models the energy of step k as ``E_k = a(m_k) + sum_{i in M_k} e_{i,k}``: a shared
energy paid once per step (mostly the weight read; ``a`` in the profile's law, optionally a function of the
number of requests in the step) and the own energy of each scheduled request under the profile's law
``E = a + c1*P + c2*A + b*n + kappa*L``:

* a prefill chunk of ``k`` tokens after ``c`` computed tokens: ``c1*k + c2*(k*c + k*(k+1)/2)`` (the chunks of
  one prompt telescope to ``c1*p + c2*p*(p+1)/2``, so chunking does not change a request's own energy);
* a decode step at context ``c + 1``: ``b + kappa*(c + 1)``.

A logged decode run of ``n`` steps (every request adds one token per step, its context grows by one per step)
is expanded analytically: each request gets ``n*b + kappa*(n*(c+1) + n*(n-1)/2)`` and the run's shared energy
is ``n*a(m)``. Which scheduled work is a decode is decided exactly as the engine does (`Replica.start`): a
request with ``k == 1`` new token whose computed tokens have caught up (``c + 1 == prompt + generated``) after
it has generated at least one token. The number generated is tracked by walking the log, so the log must
start with each request's first step (a full run, or a ledger that has seen every step) and the prompt
lengths must be given.

The step log does not carry the clock or SM share a step ran at. `StepLaw` therefore holds one coefficient set
per replica (by default the profile's law at a given clock, or the pool's current clock, and the replica's
layout share). Attribution only uses the *ratios* of the terms within a segment: by default each segment's
logged (metered, possibly noisy) energy is split in proportion to its law terms,
``share_{i,k} = logged_k * term_{i,k} / law_k``, so a wrong absolute level (another clock, calibration scale,
noise) cancels per segment and the shares always add up to the logged energy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from commitenv.profiles.schema import Profile
from commitenv.sim.coeffs import StepCoeffs, coeffs_for
from commitenv.sim.devices import device_state
from commitenv.sim.pool import StepLogBatch

SharedFn = Callable[[int], float]


class StepLaw:
    """Energy-law coefficients per replica, and the shared energy ``a(m)`` of a step of ``m`` requests.

    ``coeffs`` is one `StepCoeffs` for every replica, or a sequence indexed by replica. ``shared_fn`` (if
    given) replaces the constant ``a`` of every replica by ``a(m)`` (mixture-of-experts models, section 6.6).
    """

    def __init__(self, coeffs: StepCoeffs | Sequence[StepCoeffs], shared_fn: SharedFn | None = None) -> None:
        self._single = coeffs if isinstance(coeffs, StepCoeffs) else None
        self._per = None if self._single is not None else list(coeffs)
        if self._per is not None and not self._per:
            raise ValueError("StepLaw: expected at least one coefficient set")
        self.shared_fn = shared_fn

    @classmethod
    def from_profiles(
        cls,
        profiles: Profile | Sequence[Profile],
        layout=None,
        clock_mhz: int | None = None,
        shared_fn: SharedFn | None = None,
    ) -> "StepLaw":
        """The law of every replica of ``layout`` (`PoolLayout`; default one full-share instance of model 0)
        at ``clock_mhz`` (default: the profile's reference clock) and the replica's SM share."""
        profs = [profiles] if isinstance(profiles, Profile) else list(profiles)
        insts = [(0, 1.0)] if layout is None else [(i.model, i.share) for g in layout.gpus for i in g]
        out = []
        for model, share in insts:
            p = profs[model]
            cidx = p.reference_clock_index if clock_mhz is None else p.clock_index(clock_mhz)
            out.append(coeffs_for(p, cidx, share))
        return cls(out, shared_fn)

    @classmethod
    def from_pool(cls, pool, clock_mhz: int | None = None, shared_fn: SharedFn | None = None) -> "StepLaw":
        """The law of ``pool``'s replicas at ``clock_mhz`` (default: each GPU's clock *now*) and their current
        SM shares. Right for a run that never changed clock or shares; otherwise only the ratios matter."""
        dev, out = device_state(pool), []
        for gpu, model, share in zip(dev.replica_gpu.tolist(), dev.replica_model.tolist(), dev.replica_share.tolist()):
            prof = pool.profiles[model]
            cidx = int(dev.gpu_clock_idx[gpu]) if clock_mhz is None else prof.clock_index(clock_mhz)
            out.append(coeffs_for(prof, cidx, share))
        return cls(out, shared_fn)

    def coeffs(self, replica: int) -> StepCoeffs:
        if self._single is not None:
            return self._single
        try:
            return self._per[replica]
        except IndexError:
            raise ValueError(f"StepLaw: no coefficients for replica {replica} (have {len(self._per)})") from None

    def shared(self, replica: int, m: int) -> float:
        """Shared energy of one step of ``m >= 1`` requests on ``replica``."""
        if self.shared_fn is not None:
            return float(self.shared_fn(m))
        return self.coeffs(replica).a


def prompt_lookup(prompts) -> Callable[[int], int]:
    """Prompt length by slot from a `RequestTable`, an array or sequence indexed by slot, or a mapping."""
    if prompts is None:
        raise ValueError("prompt lengths are required to tell decode steps from one-token prefill chunks")
    if hasattr(prompts, "prompt_tokens"):
        prompts = prompts.prompt_tokens
    if isinstance(prompts, Mapping):
        return prompts.__getitem__
    arr = np.asarray(prompts).tolist()
    return arr.__getitem__


class OwnTracker:
    """Per-request progress needed to classify logged work (tokens generated so far), and the own energy of
    each member of one log entry. O(m) per entry."""

    __slots__ = ("law", "prompt", "gen")

    def __init__(self, law: StepLaw, prompts) -> None:
        self.law = law
        self.prompt = prompt_lookup(prompts)
        self.gen: dict[int, int] = {}

    def own(self, entry) -> list[float]:
        """Own law energy of every member of ``entry`` (and advance the generated counts)."""
        c = self.law.coeffs(entry.replica)
        n = entry.n_steps
        gen = self.gen
        out: list[float] = []
        if n > 1:  # a decode run: every member adds one token per step, context grows by one per step
            b, kap = c.b, c.kappa
            tri = n * (n - 1) / 2
            for s, c0 in zip(entry.slots, entry.computed_before):
                out.append(n * b + kap * (n * (c0 + 1) + tri))
                gen[s] = gen.get(s, 0) + n
            return out
        prompt = self.prompt
        for s, k, c0 in zip(entry.slots, entry.new_tokens, entry.computed_before):
            g = gen.get(s, 0)
            p = prompt(s)
            if k == 1 and g >= 1 and c0 + 1 == p + g:
                out.append(c.b + c.kappa * (c0 + 1))
            else:
                out.append(c.c1 * k + c.c2 * (k * c0 + k * (k + 1) // 2))
            if c0 + k >= p + g:
                gen[s] = g + 1
        return out


@dataclass(frozen=True)
class MemberTerms:
    """Own law energies of the members of a batch of log entries (members in entry order)."""

    entry: np.ndarray  # entry index of every membership
    m: np.ndarray  # members per entry
    slots: np.ndarray  # request slot of every membership
    own: np.ndarray  # own law energy of every membership
    computed: np.ndarray  # tokens the request has computed after the entry


def member_terms(batch: Sequence, n_steps: np.ndarray, coef: np.ndarray, owns: Sequence | None = None) -> MemberTerms:
    """Own law energies of every member of ``batch`` (log entries carrying per-member ``decode`` flags, or a
    `StepLogBatch`) in one vectorised pass (`batch_member_terms`). ``coef``: (E, 5) rows of a, b, kappa, c1, c2 per
    entry. ``owns`` (own energies per entry from an `OwnTracker`, for a log without flags) replaces the flags."""
    if owns is None:
        return batch_member_terms(batch if isinstance(batch, StepLogBatch) else StepLogBatch.of(list(batch)),
                                  n_steps, coef)
    # (the ledger's hot path: only the member columns it needs, without a whole `StepLogBatch`)
    ne = len(batch)
    m = np.fromiter(map(len, [e.slots for e in batch]), np.int64, ne)
    nm = int(m.sum())
    ent = np.repeat(np.arange(ne), m)
    slots = np.fromiter(chain.from_iterable([e.slots for e in batch]), np.int64, nm)
    c0 = np.fromiter(chain.from_iterable([e.computed_before for e in batch]), np.int64, nm).astype(np.float64)
    run = n_steps > 1
    n = n_steps[ent].astype(np.float64) if run.any() else 1.0
    k = np.fromiter(chain.from_iterable([e.new_tokens for e in batch]), np.int64, nm).astype(np.float64)
    own = np.fromiter(chain.from_iterable(owns), np.float64, nm)
    return MemberTerms(ent, m, slots, own, c0 + (np.where(run[ent], n, k) if run.any() else k))


def batch_member_terms(batch: StepLogBatch, n_steps: np.ndarray, coef: np.ndarray) -> MemberTerms:
    """Own law energies of every member of ``batch`` (columns). Every member is priced as a decode (a run of ``n``
    steps: ``n*b + kappa*(n*(c+1) + n*(n-1)/2)``), then the prefill members (decode flag off, in single steps) get
    ``c1*k + c2*(k*c + k*(k+1)/2)``."""
    ne = len(batch)
    m = batch.count
    ent = np.repeat(np.arange(ne), m)
    c0 = batch.computed_before.astype(np.float64)
    if ne and (coef == coef[0]).all():  # one coefficient set for the whole batch (the usual case): scalars
        b, kap, c1, c2 = coef[0, 1], coef[0, 2], coef[0, 3], coef[0, 4]
    else:
        b, kap, c1, c2 = coef[ent, 1], coef[ent, 2], coef[ent, 3], coef[ent, 4]
    run = n_steps > 1  # a decode run: every member decodes, one token per step
    n = n_steps[ent].astype(np.float64) if run.any() else 1.0
    own = n * b + kap * (n * (c0 + 1.0) + 0.5 * n * (n - 1.0))
    comp = c0 + n
    ix = np.flatnonzero(~batch.decode & ~run[ent])
    if len(ix):
        k = batch.new_tokens[ix].astype(np.float64)
        cp = c0[ix]
        if np.ndim(c1):
            c1, c2 = c1[ix], c2[ix]
        own[ix] = c1 * k + c2 * (k * cp + 0.5 * k * (k + 1.0))
        comp[ix] = cp + k
    return MemberTerms(ent, m, batch.slots, own, comp)


@dataclass(frozen=True)
class StepTable:
    """A step log decomposed under the energy law (one row per log entry, members in CSR form).

    Players are ``players[j]`` (request slots); ``member`` holds player indices. Energies in joules:
    ``shared_law[e] = n_steps * a(m)``, ``own_law[x]`` for membership ``x``, ``law_j = shared + sum own``,
    ``logged_j`` the entry's logged energy.
    """

    players: np.ndarray  # int64 slots, one per player
    offsets: np.ndarray  # int64, n_entries + 1
    member: np.ndarray  # int64 player index per membership
    own_law: np.ndarray  # float64 per membership
    n_steps: np.ndarray  # int64 per entry
    m: np.ndarray  # int64 requests per entry
    a_unit: np.ndarray  # float64 per entry: shared energy of one step at the entry's m (a(m))
    shared_law: np.ndarray  # float64 per entry: n_steps * a(m)
    law_j: np.ndarray  # float64 per entry
    logged_j: np.ndarray  # float64 per entry
    t0: np.ndarray
    t1: np.ndarray
    gpu: np.ndarray
    replica: np.ndarray
    shared_fn: SharedFn | None = None

    @property
    def n(self) -> int:
        return len(self.players)

    @property
    def n_entries(self) -> int:
        return len(self.n_steps)

    @property
    def entry_of(self) -> np.ndarray:
        """Entry index of every membership."""
        return np.repeat(np.arange(self.n_entries), self.m)

    def scale(self, mode: str = "step") -> np.ndarray:
        """Per-entry factor applied to the law terms: ``"step"``: logged/law (each segment's terms split its
        logged energy), ``"none"``: 1 (the law itself)."""
        if mode == "none":
            return np.ones(self.n_entries)
        if mode == "step":
            law = self.law_j
            return np.divide(self.logged_j, law, out=np.ones_like(law), where=law > 0)
        raise ValueError(f"scale: expected 'step' or 'none', got {mode!r}")

    def own_per_player(self, mode: str = "none") -> np.ndarray:
        """Own energy e_i of every player (law, or scaled per entry)."""
        w = self.own_law if mode == "none" else self.own_law * self.scale(mode)[self.entry_of]
        return np.bincount(self.member, weights=w, minlength=self.n)

    def steps_per_player(self) -> np.ndarray:
        """Number of steps each player is scheduled in."""
        return np.bincount(self.member, weights=self.n_steps[self.entry_of], minlength=self.n).astype(np.int64)

    @property
    def total_steps(self) -> int:
        return int(self.n_steps.sum())


def decompose(log: Sequence, prompts, law: StepLaw, *, players: Sequence[int] | None = None) -> StepTable:
    """Decompose step-log entries (`StepLogEntry`, in log order) under ``law``.

    ``prompts`` gives prompt lengths by slot (see `prompt_lookup`). ``players`` fixes the player order (slots);
    by default the distinct slots of the log, sorted. Every logged slot must be a player.
    """
    tracker = OwnTracker(law, prompts)
    if players is None:
        players = sorted({s for e in log for s in e.slots})
    players = np.asarray(players, dtype=np.int64)
    index = {int(s): j for j, s in enumerate(players.tolist())}
    if len(index) != len(players):
        raise ValueError("players: slots must be distinct")
    ne = len(log)
    n_steps = np.empty(ne, dtype=np.int64)
    m = np.empty(ne, dtype=np.int64)
    a_unit = np.empty(ne)
    logged = np.empty(ne)
    t0 = np.empty(ne)
    t1 = np.empty(ne)
    gpu = np.empty(ne, dtype=np.int64)
    rep = np.empty(ne, dtype=np.int64)
    member: list[int] = []
    own: list[float] = []
    for x, e in enumerate(log):
        k = len(e.slots)
        if k == 0:
            raise ValueError(f"log entry {x}: a step with no requests")
        try:
            member.extend(index[s] for s in e.slots)
        except KeyError as err:
            raise ValueError(f"log entry {x}: slot {err.args[0]} is not one of the players") from None
        own.extend(tracker.own(e))
        n_steps[x] = e.n_steps
        m[x] = k
        a_unit[x] = law.shared(e.replica, k)
        logged[x] = e.energy_j
        t0[x], t1[x], gpu[x], rep[x] = e.t0, e.t1, e.gpu, e.replica
    offsets = np.zeros(ne + 1, dtype=np.int64)
    np.cumsum(m, out=offsets[1:])
    own_arr = np.asarray(own, dtype=np.float64)
    shared = n_steps * a_unit
    own_sum = np.add.reduceat(own_arr, offsets[:-1]) if ne else np.zeros(0)
    return StepTable(
        players=players,
        offsets=offsets,
        member=np.asarray(member, dtype=np.int64),
        own_law=own_arr,
        n_steps=n_steps,
        m=m,
        a_unit=a_unit,
        shared_law=shared,
        law_j=shared + own_sum,
        logged_j=logged,
        t0=t0,
        t1=t1,
        gpu=gpu,
        replica=rep,
        shared_fn=law.shared_fn,
    )
