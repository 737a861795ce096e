"""The pool's policies: the dispatch policy choosing a replica for each arrival and the local policies planning a
replica's next step (`commitenv.sim.dispatch`, `commitenv.sim.local`); the compiled loop hands each decision back to
them (`commitenv.sim.kernel.policies`)."""

from __future__ import annotations

from commitenv.sim.local import LocalPolicy


class PolicyHooks:
    """`Pool`'s dispatch and local-policy settings (mixed into `Pool`)."""

    def has_policies(self) -> bool:
        """Whether a dispatch or local policy is installed (policies may hold state: a fork deep-copies them)."""
        if self.dispatch is not None:
            return True
        return any(p is not None for p in self.local_policies)

    def set_local_policy(self, policy: LocalPolicy | None, replicas: list[int] | None = None) -> None:
        """Plan every step of ``replicas`` (all by default) with ``policy`` (None: the vLLM scheduler)."""
        which = list(range(len(self.replica_models)) if replicas is None else replicas)
        for i in which:
            self.local_policies[i] = policy
        self._set_local(which, policy is not None)

    def _set_local(self, which: list[int], on: bool) -> None:
        self._ks.set_local(which, on)
