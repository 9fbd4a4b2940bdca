"""What ``zero3`` holds and sends, for the ledgers and next to the formulas: :class:`Stage3Accounting`.

A mixin of :class:`~zerokit.zero.stage3.ZeroStage3` (the mechanism stays there): where its tensors live
for the memory ledger — shards (on the host under offload), the persistent parameters'
master, the gradient shards, buckets and reductions in flight — and the formulas of
:mod:`zerokit.theory` it is held against, with expert parallelism's split (dense units over dp,
the experts' over edp, :mod:`.experts`).
"""
from __future__ import annotations

from .. import theory
from .experts import unit_params


class Stage3Accounting:
    """The memory ledger's sources and the theory's model states and bytes per step, of a ``zero3`` instance."""

    def track_memory(self, ledger):
        super().track_memory(ledger)
        ledger.track(self.offload.category("params"), lambda: [u.shard for u in self.units])
        ledger.track("params", lambda: [self.persistent_master] if self.persistent is not None else [])
        self.offload.track_optimizer(ledger, self.optimizer)

        def gradient_memory():
            yield from (s for s in self.grad_shards if s is not None)
            if self.persistent_grad is not None:
                yield self.persistent_grad
            yield from (u.bucket for u in self.units if u.bucket is not None)
            for flight in self._in_flight:
                yield from flight

        ledger.track("grads", gradient_memory)

    def flat_units(self):
        return [u.flat.numel for u in self.units]

    def persistent_numel(self) -> int:
        return self.persistent.numel if self.persistent is not None else 0

    def optimizer_tensors(self):
        return self.optimizer.step_scalars

    def stepped_sharded(self) -> list:
        """The units' shards, then the persistent parameters, held whole on every rank."""
        return [True] * len(self.units) + ([False] if self.persistent is not None else [])

    def theory_model_states(self, psi):
        if self.expert_group is None:
            return super().theory_model_states(psi)
        return theory.expert_zero_model_state_bytes(
            3, unit_params([u.flat for u in self.units], False), self.world,
            unit_params([u.flat for u in self.units], True), self.expert_group.world, self.config.precision,
            self.config.optimizer.name, optimizer_tensors=self.optimizer_tensors(),
            persistent_numel=self.persistent_numel(), frozen_numel=self.frozen_numel())

    def _theory_comm_by_axis(self) -> dict:
        b = theory.param_bytes_per_element(self.config.precision)
        flats = [u.flat for u in self.units]
        return theory.expert_zero_comm_bytes(3, unit_params(flats, False), self.world, unit_params(flats, True),
                                             self.expert_group.world if self.expert_group is not None else 1, b,
                                             self.config.micro_batches, persistent_numel=self.persistent_numel(),
                                             reshard_after_forward=self.opts["reshard_after_forward"])

    def theory_comm_bytes(self, psi):
        """Formula: bytes per step on dp (with expert parallelism: the dense units' alone)."""
        if self.expert_group is None:
            b = theory.param_bytes_per_element(self.config.precision)
            return theory.comm_bytes_per_step(3, psi, self.world, b, self.config.micro_batches,
                                              units=self.flat_units(), persistent_numel=self.persistent_numel(),
                                              reshard_after_forward=self.opts["reshard_after_forward"])
        return self._theory_comm_by_axis()["dp"]

    def theory_expert_comm_bytes(self):
        """Formula: bytes per step on edp, the expert units' (0 without expert parallelism)."""
        return 0 if self.expert_group is None else self._theory_comm_by_axis()["edp"]
