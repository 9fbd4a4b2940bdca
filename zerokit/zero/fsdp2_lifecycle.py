"""FSDP2's defaults on ``zero3``'s mechanism: how ``hsdp`` holds its gradients and gathers ahead.

``zero3`` takes DeepSpeed's defaults; ``hsdp`` is FSDP2's layout (``fully_shard`` on a 2-D mesh),
so it takes FSDP2's (torch 2.13, ``torch.distributed.fsdp._fully_shard``). :class:`FSDP2Lifecycle`,
a mixin placed before :class:`~.stage3.ZeroStage3`, changes what a rank holds and when, in one
backward and between steps — never what is sent:

1. **a unit's gradients stay where autograd put them** (each parameter's ``.grad``) until every
   one of them is in; only then is the unit's flat bucket allocated, the gradients copied into it
   and dropped, and the bucket reduce-scattered (FSDP2's ``post_backward``: ``foreach_reduce``
   copies the unsharded gradients into its reduce-scatter input). ``zero3`` (DeepSpeed's IPG
   bucket) allocates the whole bucket at the unit's first gradient and copies each one in as it
   comes;
2. **one reduce-scatter in flight**: a unit's reduce-scatter waits for the one before it to land
   (FSDP2's ``reduce_scatter_max_input_buffers=1``), which is ``hsdp``'s default
   ``reduce_bucket_size`` of :data:`ONE_IN_FLIGHT` element; DeepSpeed's is 500 M elements;
3. **prefetch one unit ahead in backward, none in forward** (:class:`FSDP2Prefetcher`, ``hsdp``'s
   ``prefetch_bucket_size=None``): as a unit's backward begins, the all-gather of the next unit in
   backward order is launched (FSDP2's default ``_backward_prefetch``); in forward a unit is
   gathered when it begins (FSDP2 prefetches in forward only when told,
   ``set_modules_to_forward_prefetch``; on a GPU its all-gather stream runs ahead of the compute
   by itself, which on gloo's CPU it cannot). zerokit's choice, as for ``zero3``: the backward order
   is the one the first step recorded (:mod:`.trace`), so the first step prefetches nothing;
4. **the gradient shards are allocated at a step's first reduce-scatter** and freed by
   ``zero_grad`` (``contiguous_gradients=False``, FSDP2's ``zero_grad(set_to_none=True)``): no
   gradient memory from the step to the next backward.

Peak memory (``zerokit bench zero``): ``hsdp`` then holds, sample by sample, what FSDP2 holds —
the FSDP2 peer's ledger reads FSDP2's own buffers (the prefetched unit's all-gather output, the
reduce-scatter input in flight) and is sampled in backward on its unsharded parameters; the peaks
differ by the AdamW step scalars alone (``tests/zero/test_hsdp.py``). FSDP2 also keeps a unit's
all-gather output in forward until the next unit's copy-out; ``hsdp`` gathers into the unit's own buffer.
"""
from __future__ import annotations

import torch

from .prefetch import Prefetcher
from .units import State, Unit

#: ``hsdp``'s default ``reduce_bucket_size``: a reduce-scatter launches once the one before it has landed
ONE_IN_FLIGHT = 1


class FSDP2Prefetcher(Prefetcher):
    """FSDP2's default prefetch: the next unit in backward order as a unit's backward begins; none in forward."""

    def __init__(self, units, enabled: bool):
        super().__init__(units, 0, enabled)

    def prefetch(self, phase: str, current: Unit, gather) -> None:
        if self.enabled and phase == "backward":
            for index in self.trace.ahead(phase, current.index)[:1]:
                unit = self.units[index]
                if unit.state is State.SHARDED:
                    gather(unit)
                    self._launched[phase].append(unit)
        self._measure(phase, current)


class FSDP2Lifecycle:
    """A mixin before :class:`~.stage3.ZeroStage3`: gradients held until their unit is complete, FSDP2's prefetch."""

    def make_prefetcher(self) -> Prefetcher:
        """``prefetch_bucket_size=None``: FSDP2's (:class:`FSDP2Prefetcher`); a number: DeepSpeed's budget."""
        if self.opts["prefetch_bucket_size"] is None:
            return FSDP2Prefetcher(self.units, self.opts["prefetch"])
        return super().make_prefetcher()

    @torch.no_grad()
    def _on_gradient_ready(self, p) -> None:
        """Count ``p`` in (its ``.grad`` stays; a second gradient in this backward accumulated into it already);
        the unit's last one launches its reduction."""
        unit = self.unit_of[p]
        if self.reducer.launched[unit.index]:
            raise RuntimeError(f"strategy {self.name!r}: parameter {self.names[p]!r} received a gradient after its "
                               f"unit {unit.label!r} was reduce-scattered in this backward (reentrant checkpointing "
                               f"runs backward twice); use torch.utils.checkpoint(..., use_reentrant=False)")
        self.reducer.ready(unit.index, p)
        self.reducer.launch_full(unit.index)

    def _reduce_unit(self, index: int) -> None:
        """Every gradient of the unit is in: its bucket now, each ``.grad`` copied in and dropped, zeros where
        none came; then ``zero3``'s reduce-scatter."""
        unit = self.units[index]
        if any(p.grad is not None for p in unit.flat.params):
            unit.bucket = unit.flat.new_bucket()
            for p in unit.flat.params:
                offset, numel = self.slot[p]
                view = unit.bucket[offset:offset + numel].view_as(p)
                view.copy_(p.grad) if p.grad is not None else view.zero_()
                p.grad = None
        super()._reduce_unit(index)

    def _drop_backward(self) -> None:
        """Backward failed: the gradients held in ``.grad`` go with the pass."""
        for p in self.params:
            p.grad = None
        super()._drop_backward()
