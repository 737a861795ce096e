"""The pool's policies: the dispatch policy choosing a replica for each arrival and the local policies planning a
replica's next step (`commitenv.sim.dispatch`, `commitenv.sim.local`); the compiled loop hands each decision back to
them (`commitenv.sim.kernel.policies`)."""

from __future__ import annotations

from commitenv.sim.kernel.layout import I_LOCAL_N
from commitenv.sim.local import LocalPolicy


class PolicyHooks:
    """`Pool`'s dispatch and local-policy settings (mixed into `Pool`)."""

    def has_policies(self) -> bool:
        """Whether a dispatch or local policy is installed (policies may hold state: a fork deep-copies them)."""
        if self.dispatch is not None:
            return True
        return any(p is not None for p in self.local_policies)

    @property
    def compiled_plans(self) -> int:
        """Steps planned by a compiled local policy inside the loop (`commitenv.sim.local_compiled`; `local_calls`
        counts the plans called back on the host)."""
        return int(self._ks.si[I_LOCAL_N]) if self._ks is not None else 0

    def set_local_policy(self, policy: LocalPolicy | None, replicas: list[int] | None = None) -> None:
        """Plan every step of ``replicas`` (all by default) with ``policy`` (None: the vLLM scheduler)."""
        which = list(range(len(self.replica_models)) if replicas is None else replicas)
        for i in which:
            self.local_policies[i] = policy
        self._set_local_modes()

    def _set_local_modes(self) -> None:
        """Where each replica's steps are planned: in the compiled loop for the replicas of the first policy that
        offers a compiled plan (`LocalPolicy.compiled`; the loop carries one), on the host for the others."""
        owner = None
        modes = []
        sizes = self._ks.compiled_sizes()
        for p in self.local_policies:
            if p is not None and owner is None and p.compiled(*sizes) is not None:
                owner = p
            modes.append(0 if p is None else 2 if p is owner else 1)
        self._ks.set_local_modes(modes)
