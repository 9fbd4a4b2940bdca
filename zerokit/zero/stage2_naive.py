"""``zero2-naive``: "all-reduce the gradients, then drop what you don't own" — and why that is not ZeRO-2.

The seed article describes ZeRO-2 this way. It does end a step with the same model
states as ``zero2`` (params whole, gradients and optimizer states for the own shard),
but on the way there:

- every rank holds the **full** gradients: backward accumulates them into one flat
  buffer of the whole model, and only after the all-reduce is the non-owned part
  freed (storage resized to 0). The ledger's gradient peak is the full padded buffer,
  where ``zero2``'s is its shard plus a bucket or two;
- it **all-reduces** (2(N−1)/N·Ψb) instead of reduce-scattering ((N−1)/N·Ψb), then
  all-gathers the updated parameters as every stage does: 3(N−1)/N·Ψb per step, as
  much as ZeRO-3 moves, for ZeRO-2's memory (FACTS §2, §8).

ZeRO-2 proper (``zero2``, arXiv 1910.02054 §5.2) reduce-scatters each bucket to its
owners *during* backward and frees it right away.
"""
from __future__ import annotations


import torch

from .. import theory
from ..runtime import comm
from ..strategies.base import register
from .flat_buffer import alloc_storage, free_storage
from .sharded import ShardedDataParallel, stage_option


@register
class NaiveZeroStage2(ShardedDataParallel):
    """Full gradients in one flat buffer; after backward all-reduce it, keep the own shard, free the rest."""

    name = "zero2-naive"
    stage = 2
    options = {"stage": stage_option(2)}

    def __init__(self, model, ctx, config, **options):
        super().__init__(model, ctx, config, **options)
        (self.unit,) = self.units
        self.grad_buffer = self.unit.new_flat()
        self.grad_shard = None

    def unit_numel(self) -> int:
        return sum(p.numel() for p in self.params)  # one unit: the whole model

    def _attach_grads(self) -> None:
        for p, view in zip(self.unit.params, self.unit.views(self.grad_buffer)):
            p.grad = view

    def backward(self, loss):
        loss.backward()
        if self._sync:
            self.all_reduce_then_drop()

    @torch.no_grad()
    def all_reduce_then_drop(self) -> None:
        """Average the full gradients on every rank, keep the own shard, release the full buffer."""
        self.grad_buffer.div_(self.world)
        comm.all_reduce(self.grad_buffer, group=self.group, tag="all gradients")
        self.grad_shard = self.unit.shard(self.grad_buffer).clone()
        for p in self.params:
            p.grad = None
        free_storage(self.grad_buffer)

    def zero_grad(self):
        self.grad_shard = None
        for p in self.params:
            p.grad = None
        alloc_storage(self.grad_buffer)
        self.grad_buffer.zero_()
        self._attach_grads()

    def grad_shards(self):
        return [self.grad_shard]

    def track_memory(self, ledger):
        super().track_memory(ledger)
        ledger.track("grads", lambda: [t for t in (self.grad_shard, self.grad_buffer) if t is not None])

    def theory_comm_bytes(self, psi):
        """An all-reduce of the padded gradients plus the all-gather of the parameters, once per step."""
        b = theory.param_bytes_per_element(self.config.precision)
        padded = theory.padded_numel(self.flat_units(), self.world) * b
        return (theory.ring_bytes_sent("all_reduce", padded, self.world)
                + theory.ring_bytes_sent("all_gather", padded, self.world))
