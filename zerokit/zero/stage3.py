"""``zero3``: ZeRO stage 3, + parameter partitioning (P_os+g+p, arXiv 1910.02054 §5.3).

At rest a rank holds only its shard of everything: parameters, gradients, optimizer
states, 16Ψ/N in all (FACTS §1). The model is cut into *units* (:mod:`.units`: by default one
per transformer block, the root taking embeddings and head; tied parameters join the
unit of their modules' common ancestor) — each a flat buffer padded to a multiple of
N (:mod:`.flat_buffer`), each in one state, sharded → gathering → gathered → sharded.
The hook lifecycle of one unit, as in FSDP2's ``fully_shard``:

1. **before its forward** (module pre-hook): all-gather the unit — allocate its full
   buffer (the parameters are views into it) and gather every rank's shard into it;
2. **after its forward** (module post-hook): free it — the buffer's storage is resized
   to 0 bytes and the ledger counts nothing (``reshard_after_forward=False`` keeps it
   until backward: ZeRO-2-like memory, one gather per step instead of two);
3. **before its backward** (a hook on the gradient of the unit's output): all-gather it
   again — the tensors autograd saved share the buffer's storage, so they see it;
4. **after its backward** (post-accumulate-grad hooks: every parameter's gradient is
   there): copy the gradients into a flat bucket, reduce-scatter it into the own
   gradient shard (divided by N first), free the bucket and the gathered parameters.
   The counting, the in-flight reductions and the end-of-backward callback are the
   shared :class:`~zerokit.data_parallel.reducer.Reducer`'s.

A forward under ``torch.no_grad()`` (evaluation) frees each unit after its forward:
no backward will come. A block under non-reentrant activation checkpointing runs its
forward again *during* backward: its unit is gathered again (if it was freed) and is
not freed after the recompute — its backward is about to use it. ``step`` frees any
unit still gathered before it updates the shards, so no stale copy survives a step.
If backward raises, every unit is freed and the pass is dropped.

``prefetch`` (:mod:`.prefetch`): from the second step on, the gathers of the next
units are launched while this one computes, every unit ahead in flight counting
against ``prefetch_bucket_size`` elements.
``overlap_comm``: reduce-scatters are asynchronous, at most ``reduce_bucket_size``
gradient elements in flight; otherwise each is waited for at once.
``param_persistence_threshold``: parameters with fewer elements are never sharded —
kept whole, their gradients all-reduced once per micro-batch, stepped whole on every
rank (DeepSpeed's ``stage3_param_persistence_threshold``).

With expert parallelism (``ep`` > 1, :mod:`.experts`) a module's experts form a unit of their own, sharded
over the ranks holding the same experts (``edp``), gradients divided by N = dp like the dense ones.

The step updates the shards only (on the host with ``offload``, :mod:`zerokit.offload`;
``"params"`` also rests them there); the next forward gathers them. Traffic per micro-batch:
two all-gathers and one reduce-scatter of every unit, 3(N−1)/N·Ψb — 1.5 × DDP for every N
(FACTS §2); what the ledgers see and the formulas it is held against: :mod:`.stage3_accounting`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten

from ..data_parallel.base import check_replicas_match
from ..data_parallel.reducer import Reducer
from ..offload.zero_hooks import Offload
from ..strategies.base import Strategy, register
from .experts import (check_expert_options, check_expert_replicas, gather_local, group_of, is_expert, reduce_local,
                      shard_groups, split_experts)
from .flat_buffer import FlatUnit, all_gather_flat, check_trainable, check_world_size
from .persistent import PersistentParameters
from .prefetch import Prefetcher
from .sharded import REFUSED, reduce_scatter_flat
from .stage3_accounting import Stage3Accounting
from .stage3_options import DEFAULT_PREFETCH_BUCKET, STAGE3_OPTIONS

__all__ = ["ZeroStage3", "DEFAULT_PREFETCH_BUCKET", "UNIT_SIZE_OPTION", "non_negative_elements"]
from .units import UNIT_SIZE_OPTION, State, Unit, form_units, in_backward, non_negative_elements  # noqa: F401


@register
class ZeroStage3(PersistentParameters, Stage3Accounting, Strategy):
    """ZeRO-3: parameters sharded at rest, gathered unit by unit for forward and for backward."""

    #: data parallelism over the tensor-parallel shards when the mesh has tp > 1 (2-D parallelism); with expert
    #: parallelism the experts' units are sharded over edp (:mod:`.experts`)
    axes = ("dp", "cp", "ep", "tp")
    name = "zero3"
    stage = 3
    pipeline_refusal = REFUSED
    options = STAGE3_OPTIONS

    def __init__(self, model, ctx, config, exclude: frozenset = frozenset(), param_dtype=None, reduce_dtype=None,
                 **options):
        """``exclude``: ids of parameters another instance manages (``zerokit.fully_shard``'s blocks, sharded by
        their own calls): left out of this one's units, hooks and replica check. ``param_dtype`` /
        ``reduce_dtype`` (``zerokit.fully_shard``'s ``mp_policy``): the dtype a gathered unit computes in and the
        one its gradients are reduced in; the shards, their gradients and what the optimizer steps keep the
        parameters' own dtype (FSDP2's mixed precision)."""
        super().__init__(model, ctx, config, **options)
        params = [p for p in check_trainable(model, self.name) if id(p) not in exclude]
        if not params:
            raise ValueError(f"strategy {self.name!r}: every trainable parameter of this module is sharded already")
        check_expert_options(self)
        #: the groups units are sharded over: dense ones over dp, the experts' over edp (None without experts)
        self.dense_group, self.expert_group = self.make_shard_groups()
        if self.expert_group is None:
            check_world_size(sum(p.numel() for p in params), self.world)
        else:
            for group, kind in ((self.dense_group, False), (self.expert_group, True)):
                check_world_size(sum(p.numel() for p in params if is_expert(p) == kind), group.world)
        if not exclude:  # with exclude, the caller broadcast what this instance holds (the rest differs by rank)
            check_replicas_match(model, self.group, ctx.device)
            check_expert_replicas(self, model, ctx.device)
        self.params = params
        self.names = {p: n for n, p in model.named_parameters()}
        threshold = int(self.opts["param_persistence_threshold"])
        # zerokit's choice: an expert parameter is always sharded (over edp), however small; the threshold keeps
        # small dense parameters whole
        persistent = [p for p in params if p.numel() < threshold and not is_expert(p)]
        self.persistent: Optional[FlatUnit] = None
        dtypes = dict(compute_dtype=param_dtype, reduce_dtype=reduce_dtype)
        #: the persistent parameters in their own dtype, what the optimizer steps (under a 16-bit compute dtype
        #: ``persistent.data`` is its cast, refreshed by :meth:`refresh_persistent`)
        self.persistent_master: Optional[torch.Tensor] = None
        if persistent:
            self.persistent = FlatUnit(persistent, 1, 0, -1, [self.names[p] for p in persistent], **dtypes)
            self.persistent_master = self.persistent.rest_shard
            if self.persistent_master is None:
                self.persistent_master = self.persistent.data
        self.units: List[Unit] = []
        frozen = {p for p in model.parameters() if not p.requires_grad or id(p) in exclude}  # held whole / elsewhere
        for spec, expert in split_experts(form_units(model, self.opts["unit_size"], set(persistent) | frozen),
                                          self.expert_group is not None):
            group = self.expert_group if expert else self.dense_group
            flat = FlatUnit(spec.params, group.world, group.rank, len(self.units),
                            [self.names[p] for p in spec.params], expert=expert, **dtypes)
            self.units.append(Unit(spec, flat))
        self.unit_of: Dict[nn.Parameter, Unit] = {p: u for u in self.units for p in u.flat.params}
        self.slot = {p: (u.flat.offsets[i], p.numel()) for u in self.units for i, p in enumerate(u.flat.params)}
        for unit in self.units:
            unit.free()
        self.offload = Offload(self, self.opts["offload"])  # zerokit.offload; "params": the shards move to the host
        stepped = [u.shard for u in self.units] + ([self.persistent_master] if self.persistent else [])
        self.optimizer = self.offload.optimizer(stepped, [u.flat.shard_layout() for u in self.units] + (
            [self.persistent.shard_layout()] if self.persistent else []))
        self.grad_shards: List[Optional[torch.Tensor]] = [None] * len(self.units)
        self.shard_buffer = None
        if self.opts["contiguous_gradients"]:
            self.shard_buffer = torch.zeros(sum(u.flat.shard_numel for u in self.units), dtype=self.units[0].shard.dtype,
                                            device=params[0].device)
            self.grad_shards = list(self.shard_buffer.split([u.flat.shard_numel for u in self.units]))  # views
        self.persistent_grad: Optional[torch.Tensor] = None
        self._written = [False] * len(self.units)
        #: [bucket, reduced output] of each reduce-scatter in flight, for the memory ledger
        self._in_flight: list = []
        self.prefetcher = self.make_prefetcher()
        self.reducer = Reducer([len(u.flat.params) for u in self.units], self._reduce_unit, in_order=False,
                               after_finish=self._close_backward, on_abort=self._drop_backward)
        self._hooks = []
        for unit in self.units:
            self._hooks.append(unit.module.register_forward_pre_hook(
                lambda m, args, unit=unit: self._pre_forward(unit)))
            self._hooks.append(unit.module.register_forward_hook(
                lambda m, args, out, unit=unit: self._post_forward(unit, out)))
        for p in params:
            self._hooks.append(p.register_post_accumulate_grad_hook(self._on_gradient_ready))

    def make_shard_groups(self):
        """(dense group, expert group or None): the groups the units are sharded over (``hsdp``: a node's ranks)."""
        return shard_groups(self)

    def make_prefetcher(self) -> Prefetcher:
        """DeepSpeed's: the units ahead within ``prefetch_bucket_size`` elements, in both passes (``hsdp``: FSDP2's)."""
        return Prefetcher(self.units, int(self.opts["prefetch_bucket_size"]), self.opts["prefetch"])

    def after_reduce_scatter(self, unit: Unit, reduced: torch.Tensor, land) -> None:
        """One micro-batch's reduced gradient shard of ``unit`` has landed in ``reduced``; ``land()`` adds it to the
        step's shard (and returns that shard): here at once (``hsdp`` all-reduces across the replicas around it)."""
        land()

    # -- gathering -------------------------------------------------------------------
    def unit_group(self, unit: Unit):
        """The :class:`~.experts.ShardGroup` ``unit`` is sharded over: dp, or edp for an expert unit."""
        return group_of(self.dense_group, self.expert_group, unit.flat)

    def _gather(self, unit: Unit) -> None:
        group = self.unit_group(unit)
        if group.world == 1:  # ep = dp, or one rank: nothing to all-gather (a shard resting on the host is fetched)
            unit.gather(self.offload.gather_fn(gather_local))
            return
        unit.gather(self.offload.gather_fn(lambda out, shard, tag: all_gather_flat(out, shard, group.group,
                                                                                    self.opts["algorithm"], True, tag)))

    def _free_all(self) -> None:
        for unit in self.units:
            if unit.state is not State.SHARDED:
                unit.free()

    # -- forward -------------------------------------------------------------------
    def _pre_forward(self, unit: Unit) -> None:
        recompute = in_backward()
        if torch.is_grad_enabled() and not recompute:
            self.prefetcher.record("forward", unit)
        self._gather(unit)
        if not recompute:
            self.prefetcher.prefetch("forward", unit, self._gather)
        unit.wait()

    def _post_forward(self, unit: Unit, output) -> None:
        if in_backward():
            return  # a checkpointed block's recompute: its backward runs next and needs the parameters
        if not torch.is_grad_enabled():
            unit.free()  # evaluation: no backward will come
            return
        for t in tree_flatten(output)[0]:
            if torch.is_tensor(t) and t.requires_grad:
                t.register_hook(lambda grad, unit=unit: self._pre_backward(unit))
        if self.opts["reshard_after_forward"]:
            unit.free()

    # -- backward ------------------------------------------------------------------
    def _pre_backward(self, unit: Unit) -> None:
        """A hook on the gradient of the unit's output: its backward is next, so gather it."""
        self.reducer.begin()
        if unit.backward_started:
            return
        unit.backward_started = True
        self.prefetcher.record("backward", unit)
        self._gather(unit)
        self.prefetcher.prefetch("backward", unit, self._gather)
        unit.wait()

    @torch.no_grad()
    def _on_gradient_ready(self, p) -> None:
        unit = self.unit_of.get(p)
        if unit is None:
            self.reducer.begin()
            return  # persistent: its gradient stays in p.grad until the end of backward
        if self.reducer.launched[unit.index]:
            raise RuntimeError(f"strategy 'zero3': parameter {self.names[p]!r} received a gradient after its unit "
                               f"{unit.label!r} was reduce-scattered in this backward (reentrant checkpointing "
                               f"runs backward twice); use torch.utils.checkpoint(..., use_reentrant=False)")
        if unit.bucket is None:
            unit.bucket = unit.flat.new_bucket()
        offset, numel = self.slot[p]
        view = unit.bucket[offset:offset + numel].view_as(p)
        if self.reducer.ready(unit.index, p):
            view.copy_(p.grad)
        else:
            view.add_(p.grad)
        p.grad = None
        self.reducer.launch_full(unit.index)

    def _reduce_unit(self, index: int) -> None:
        """Every gradient of the unit is in its bucket: free the parameters, reduce-scatter the bucket."""
        unit = self.units[index]
        if unit.bucket is None:
            unit.bucket = unit.flat.new_flat()  # no gradient came: reduce zeros, in lockstep
        elif not self.reducer.is_full(index):
            unit.flat.zero_slots(unit.bucket, set(unit.flat.params) - self.reducer.seen)
        unit.free()
        if self.grad_shards[index] is None:
            self.grad_shards[index] = unit.flat.new_grad_shard()
        first, self._written[index] = not self._written[index], True
        shard = self.grad_shards[index]
        out = shard if first and shard.dtype == unit.flat.reduce_dtype else unit.flat.new_shard()
        bucket, unit.bucket = unit.bucket, None
        bucket.div_(self.world)  # N = dp for an expert unit too: its gradient holds its ep group's tokens already
        overlap = self.opts["overlap_comm"]
        if overlap:
            self.reducer.wait_until(int(self.opts["reduce_bucket_size"]), bucket.numel())
        work = self._reduce_scatter(unit, out, bucket, overlap)
        flight = [bucket, out]
        self._in_flight.append(flight)

        def land():
            if out is not shard:
                shard.copy_(out) if first else shard.add_(out)
            return shard

        def done():
            # by identity: a local reduction (a group of one) completes while older ones are still in flight
            self._in_flight[:] = [f for f in self._in_flight if f is not flight]
            self.after_reduce_scatter(unit, out, land)

        self.reducer.track(work, bucket.numel(), done)

    def _reduce_scatter(self, unit: Unit, out: torch.Tensor, bucket: torch.Tensor, overlap: bool):
        """Sum ``bucket`` over the unit's group, this rank's shard into ``out``: a Work in flight, or None when done.
        The one place a gradient bucket meets the network (ZeRO++'s qgZ reduces it another way)."""
        group = self.unit_group(unit)
        if group.world == 1:
            return reduce_local(out, bucket)
        return reduce_scatter_flat(out, bucket, group.group, self.opts["algorithm"], overlap, f"grads {unit.label}")

    def _close_backward(self) -> None:
        """End of backward, after every reduce-scatter landed."""
        if self.persistent is not None:
            self._reduce_persistent()
        for unit in self.units:
            unit.reset_backward()
        self.prefetcher.close_pass()

    def _drop_backward(self) -> None:
        """Backward failed: drop half-filled buckets and the pass's bookkeeping."""
        self._in_flight.clear()
        for unit in self.units:
            unit.bucket = None
            unit.reset_backward()
        self.prefetcher.drop_pass()

    # -- the loop --------------------------------------------------------------------
    def backward(self, loss):
        try:
            self.reducer.backward(loss)
        except BaseException:
            self._free_all()
            raise
        self.offload.after_backward()  # offload: the reduced shards go to the host, the device keeps none

    @contextmanager
    def no_sync(self):
        """ZeRO-3 reduces every micro-batch: a rank keeps no gradients it does not own (FACTS §2)."""
        yield

    def step(self):
        self._free_all()  # a unit gathered now would be stale once its shard steps
        grads = list(self.grad_shards) + ([self.persistent_grad] if self.persistent is not None else [])
        self.optimizer.step(grads)
        self.refresh_persistent()

    def zero_grad(self):
        self._written = [False] * len(self.units)
        if self.shard_buffer is None:
            self.grad_shards = [None] * len(self.units)
        self.persistent_grad = None
        for p in self.params:
            p.grad = None

    # -- whole parameters ------------------------------------------------------------
    @contextmanager
    def gathered(self):
        """Every unit gathered (phase-neutral, synchronous), freed again on exit: the whole model, briefly."""
        was_free = [u for u in self.units if u.state is State.SHARDED]
        for unit in was_free:
            self._gather(unit)
            unit.wait()
        try:
            yield
        finally:
            for unit in was_free:
                unit.free()

    def full_parameters(self):
        with self.gathered():
            return {n: p.detach().float().cpu().clone() for n, p in self.model.named_parameters()}
