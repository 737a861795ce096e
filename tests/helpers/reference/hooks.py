"""The reference engine's calls into dispatch and local policies, with the views built from its objects."""

from __future__ import annotations

import time

from commitenv.sim.dispatch import ArrivalView, CandidateView
from commitenv.sim.local import LocalView, TaskView, plan_budget
from commitenv.sim.request import Req

from helpers.reference.replica import Replica


def _token_loads(rep: Replica) -> tuple[int, int]:
    """(tokens still to compute before the first output token, summed over the replica's requests; summed
    context of its requests past their prefill): what a router may know of a replica's load."""
    pre = dec = 0
    for r in (*rep.running, *rep.waiting):
        left = r.prompt + r.generated - r.computed
        if r.generated >= 1 and left <= 1:
            dec += r.computed + 1
        else:
            pre += left
    return pre, dec


class ReferenceHooks:
    """`ReferencePool`'s dispatch and local-policy hooks."""

    def _local_order(self, rep: Replica, t: float) -> tuple[tuple[int, ...], int] | None:
        """Ask ``rep``'s local policy for its next step (timed): the plan's order and token budget (0: the replica's;
        None: the vLLM scheduler); a clock in the plan is requested for the replica's GPU."""
        if not rep.has_work():
            return None
        c0 = time.perf_counter()
        tv = self._task_view
        tasks = [tv(r, True) for r in rep.running] + [tv(r, False) for r in rep.waiting]
        gpu, levels = rep.gpu, rep.clock_levels
        view = LocalView(t, rep.index, gpu.index, rep.model, levels[gpu.clock_idx], levels, rep.share, rep.free_blocks,
                         rep.bs, rep.budget, rep.max_seqs, tuple(tasks))
        policy = self.local_policies[rep.index]
        plan = policy.plan(view)
        self.local_s += time.perf_counter() - c0
        self.local_calls += 1
        if plan is None:
            return None
        budget = plan_budget(plan, rep.budget, policy.name, rep.index)
        mhz = plan.clock_mhz
        if mhz is not None:
            if mhz not in levels:
                raise ValueError(f"local policy {policy.name!r}: clock {mhz} MHz is not one of the "
                                 f"GPU's levels {list(levels)}")
            # (the replica's own levels are its GPU's when it set the GPU's profile, the common case)
            self._request_clock(gpu, levels.index(mhz) if gpu.profile is rep.profile else gpu.profile.clock_index(mhz),
                                t)
        return tuple(plan.order), budget

    def _seen(self, r: Req) -> tuple[int, float]:
        """What a policy may know of ``r``'s length and deadline: the predicted output and the visible deadline (in
        a what-if copy or a replay, the request already carries the ones it runs to)."""
        if self._slot_base == 0 and self.pred_out is not None:
            return int(self.pred_out[r.slot]), float(self.visible_deadline[r.slot])
        return r.out, r.deadline

    def _task_view(self, r: Req, running: bool) -> TaskView:
        left = r.prompt + r.generated - r.computed
        pred, deadline = self._seen(r)
        return TaskView(r.slot, running, left == 1 and r.generated >= 1, left, r.computed, r.prompt, r.generated,
                        pred, r.arrival, deadline, r.blocks, r.last_t)

    def _set_local_modes(self) -> None:
        pass  # (the object loop asks `local_policies` at every step start, and calls their `plan`)

    def _dispatched(self, r: Req, t: float, cands: list[Replica]) -> Replica:
        """The replica ``self.dispatch`` chooses for ``r`` among ``cands``, from views of both (timed)."""
        c0 = time.perf_counter()
        pol = self.dispatch
        hashes = r.hashes or ()
        req = ArrivalView(r.slot, t, r.prompt, *self._seen(r), r.model, len(hashes))
        want = pol.wants_prefix and bool(hashes)
        load = pol.wants_load
        views = tuple(
            CandidateView(rep.index, rep.gpu.index, rep.unf, len(rep.running), len(rep.waiting), rep.free_blocks,
                          rep.cap_blocks, rep.profile.clocks[rep.gpu.clock_idx].mhz, rep.share,
                          len(rep.pcache.lookup(hashes)[0]) if want and rep.pcache is not None else 0, rep.bs,
                          *(_token_loads(rep) if load else (0, 0)))
            for rep in cands)
        pick = pol.choose(req, views)
        self.dispatch_s += time.perf_counter() - c0
        self.dispatch_calls += 1
        for rep in cands:
            if rep.index == pick:
                return rep
        raise ValueError(f"dispatch policy {pol.name!r} chose replica {pick!r}, not one of the active replicas "
                         f"{[rep.index for rep in cands]} of model {r.model}")


