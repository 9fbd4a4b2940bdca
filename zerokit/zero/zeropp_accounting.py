"""What ``zeropp`` holds and sends, for the ledgers and next to the formulas: :class:`ZeroPlusPlusAccounting`.

A mixin of :class:`~zerokit.zero.zeropp.ZeroPlusPlus` (the mechanism stays there), as
:mod:`.stage3_accounting` is ZeRO-3's: the memory ledger's extra sources (hpZ's secondary copy,
under ``params``; the error tallies' workspaces under ``buffers``, when measured), and the formulas
of :mod:`zerokit.theory.zeropp` the ledgers are held against — ``theory_*`` names for computed
numbers. :func:`measured_bytes_leaving_a_node` reads the communication ledger's rows (measured
payloads) into the paper's cross-node terms, the column set next to
:meth:`ZeroPlusPlusAccounting.theory_bytes_leaving_a_node`.
"""
from __future__ import annotations

from .. import theory


class ZeroPlusPlusAccounting:
    """The secondary copy on the memory ledger; the model states and bytes per step by formula."""

    def track_memory(self, ledger):
        super().track_memory(ledger)
        if self.secondary is not None:
            ledger.track("params", lambda: list(self.secondary.shards))
        ledger.track("buffers", lambda: self.weight_error.tensors() + self.gradient_error.tensors())  # [] unmeasured

    def _element_bytes(self) -> int:
        return theory.param_bytes_per_element(self.config.precision)

    def theory_secondary_bytes(self) -> int:
        """Formula: hpZ's secondary copy on this rank, b·Σ P/s."""
        return self._element_bytes() * theory.hpz_secondary_numel(self.flat_units(), self.world, self.hpz_size)

    def theory_model_states(self, psi):
        base = super().theory_model_states(psi)
        return theory.ModelStates(base.params + self.theory_secondary_bytes(), base.grads, base.optimizer,
                                  base.step_scalars)

    def theory_comm_bytes_by_axis(self) -> dict:
        """Formula: ``{axis: bytes per step}`` on ``dp``, ``hpz``, ``node``, ``inter_node``."""
        by = theory.zeropp_collective_bytes(**self._layout())
        return {axis: sum(ops.values()) for axis, ops in by.items()}

    def theory_comm_bytes(self, psi):
        """Formula: bytes per step over every group (their split: :meth:`theory_comm_bytes_by_axis`)."""
        return sum(self.theory_comm_bytes_by_axis().values())

    def theory_bytes_leaving_a_node(self) -> dict:
        """Formula: bytes leaving a node per step, by term (the paper's cross-node accounting, to the byte)."""
        return theory.zeropp_bytes_leaving_a_node(**self._layout())

    def _layout(self) -> dict:
        o = self.opts
        return dict(units=self.flat_units(), n=self.world, bytes_per_element=self._element_bytes(),
                    ranks_per_node=self.ranks_per_node, hpz_partition_size=self.hpz_size,
                    quantized_weights=o["zero_quantized_weights"], quantized_gradients=o["zero_quantized_gradients"],
                    block_size=self.block_size, gradient_bits=o["gradient_bits"],
                    micro_batches=self.config.micro_batches, qgz_units=self.qgz_units)


def measured_bytes_leaving_a_node(summary: list, steps: int, n: int, ranks_per_node: int,
                                  hpz_partition_size: int) -> dict:
    """Bytes leaving a node per step, from the communication ledger's ``summary()`` rows (measured payloads,
    their ring cost) by the paper's terms: a ring over the ``dp`` or ``hpz`` group leaves a node as
    :func:`zerokit.theory.ring_bytes_leaving_a_node` says; qgZ's ``inter_node`` all-to-all sends all of
    each rank's bytes across, from every rank of the node (g times one rank's); ``node`` stays inside. A
    gather's term is its phase: with hpZ and A > 1 the forward term holds the hpz gathers of micro-batches
    2 … A (inside the node when s ≤ g)."""
    g, s = ranks_per_node, hpz_partition_size
    out = {"forward_all_gather": 0, "backward_all_gather": 0, "gradient_reduce_scatter": 0}
    for row in summary:
        per_step = row["ring_cost_bytes"] / steps
        axis, op, phase = row["axis"], row["op"], row["phase"]
        if op == "all_gather" and axis in ("dp", "hpz"):
            term = "forward_all_gather" if phase == "forward" else "backward_all_gather"
            size = n if axis == "dp" else s
            out[term] += theory.ring_bytes_leaving_a_node(per_step, size, 1, g)
        elif op == "reduce_scatter" and axis == "dp":
            out["gradient_reduce_scatter"] += theory.ring_bytes_leaving_a_node(per_step, n, 1, g)
        elif op == "all_to_all" and axis == "inter_node":
            out["gradient_reduce_scatter"] += g * per_step
    return out
