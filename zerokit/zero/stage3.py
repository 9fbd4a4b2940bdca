"""``zero3``: ZeRO stage 3, + parameter partitioning (P_os+g+p, arXiv 1910.02054 §5.3).

At rest a rank holds only its shard of everything: parameters, gradients, optimizer
states, 16Ψ/N in all (FACTS §1). The model is cut into *units* — a module, or a group
of small modules whose parameters together reach ``unit_size`` elements (FSDP's
wrapping) — each a flat buffer padded to a multiple of N (:mod:`.flat_buffer`). The
hook lifecycle of one unit, as in FSDP2's ``fully_shard``:

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

``prefetch``: from the second step on, the order in which units ran in the first
forward and backward is known, and the gather of the next units (up to
``prefetch_bucket_size`` elements) is launched asynchronously while this one computes.
``overlap_comm``: reduce-scatters are asynchronous, at most ``reduce_bucket_size``
gradient elements in flight; otherwise each is waited for at once.
``param_persistence_threshold``: parameters with fewer elements are never sharded —
kept whole, their gradients all-reduced once per micro-batch, stepped whole on every
rank (DeepSpeed's ``stage3_param_persistence_threshold``).

The step updates the shards only; the next forward gathers them. Traffic per
micro-batch: two all-gathers and one reduce-scatter of every unit, 3(N−1)/N·Ψb —
1.5 × DDP for every N (FACTS §2).
"""
from __future__ import annotations

import enum
from contextlib import contextmanager
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from torch.autograd import Variable
from torch.utils._pytree import tree_flatten

from .. import theory
from ..runtime import comm
from ..optim import MasterOptimizer
from ..strategies.base import Option, Strategy, boolean, register
from ..data_parallel.naive import check_replicas_match
from .flat_buffer import FlatUnit, check_trainable, check_world_size
from .stage1 import DEFAULT_REDUCE_BUCKET, ELEMENTS, positive_elements, stage_option

#: DeepSpeed's stage3_prefetch_bucket_size default in code (FACTS §7)
DEFAULT_PREFETCH_BUCKET = 50_000_000


def non_negative_elements(value) -> bool:
    return value == 0 and not isinstance(value, bool) or positive_elements(value)


class State(enum.Enum):
    FREE = "free"
    GATHERING = "gathering"
    GATHERED = "gathered"


class Unit:
    """A sharded unit: the module whose hooks drive it, its flat buffer, its shard and gradient state."""

    def __init__(self, module: nn.Module, label: str, flat: FlatUnit):
        self.module = module
        self.label = label
        self.flat = flat
        self.index = flat.index
        #: this rank's parameter shard: the only copy of the unit that lives between steps
        self.shard = flat.shard(flat.data).clone()
        self.state = State.GATHERED
        self.gather_work: Optional[comm.Work] = None
        self.bucket: Optional[torch.Tensor] = None
        self.arrived: set = set()
        self.backward_started = False
        self.reduced = False


def form_units(model: nn.Module, unit_size: int, skip: set) -> List[tuple]:
    """(module, label, parameters) per unit, children before parents (FSDP's size-based wrapping).

    Walking the module tree bottom-up, a module takes its own parameters and those its
    children left over; it becomes a unit when they reach ``unit_size`` elements (0:
    whenever it has any). The root takes whatever is left. Parameters in ``skip``
    (persistent ones) and parameters already placed (shared ones) take no part.
    """
    units: List[tuple] = []
    placed = set(skip)

    def visit(module: nn.Module, label: str, is_root: bool) -> list:
        pending = []
        for p in module.parameters(recurse=False):
            if p not in placed:
                placed.add(p)
                pending.append(p)
        for name, child in module.named_children():
            pending += visit(child, f"{label}.{name}" if label else name, False)
        if pending and (is_root or sum(p.numel() for p in pending) >= unit_size):
            units.append((module, label or type(module).__name__, pending))
            return []
        return pending

    visit(model, "", True)
    return units


@register
class ZeroStage3(Strategy):
    """ZeRO-3: parameters sharded at rest, gathered unit by unit for forward and for backward."""

    name = "zero3"
    stage = 3
    options = {
        "stage": stage_option(3),
        "unit_size": Option(0, non_negative_elements,
                            f"0 (every module with parameters of its own is a unit) or {ELEMENTS}: modules are "
                            f"grouped with their parent until their parameters reach this many"),
        "prefetch": Option(True, boolean, "True (gather the next units while this one computes, from the second "
                                          "step on) or False"),
        "prefetch_bucket_size": Option(DEFAULT_PREFETCH_BUCKET, positive_elements,
                                       f"{ELEMENTS}: the most elements prefetched ahead (stage3_prefetch_bucket_size)"),
        "reshard_after_forward": Option(True, boolean, "True (free each unit after its forward, gather it again for "
                                                       "backward: 3Ψ traffic) or False (keep it until its backward: "
                                                       "2Ψ traffic, ZeRO-2-like memory)"),
        "param_persistence_threshold": Option(0, non_negative_elements,
                                              f"0 or {ELEMENTS}: parameters smaller than this stay gathered "
                                              f"(stage3_param_persistence_threshold)"),
        "reduce_bucket_size": Option(DEFAULT_REDUCE_BUCKET, positive_elements,
                                     f"{ELEMENTS}: the most gradient elements whose reduce-scatter is in flight"),
        "overlap_comm": Option(True, boolean, "True (asynchronous reduce-scatters during backward) or False "
                                              "(each waited for at once)"),
        "contiguous_gradients": Option(True, boolean, "True (all gradient shards in one flat buffer) or False "
                                                      "(one shard tensor per unit)"),
    }

    def __init__(self, model, ctx, config, **options):
        super().__init__(model, ctx, config, **options)
        params = check_trainable(model, self.name)
        check_world_size(sum(p.numel() for p in params), self.world)
        check_replicas_match(model, self.group, ctx.device)
        self.params = params
        self.names = {p: n for n, p in model.named_parameters()}
        threshold = int(self.opts["param_persistence_threshold"])
        persistent = [p for p in params if p.numel() < threshold]
        self.persistent: Optional[FlatUnit] = None
        if persistent:
            self.persistent = FlatUnit(persistent, 1, 0, -1, [self.names[p] for p in persistent])
        self.units: List[Unit] = []
        for index, (module, label, members) in enumerate(form_units(model, int(self.opts["unit_size"]),
                                                                    set(persistent))):
            flat = FlatUnit(members, self.world, self.rank, index, [self.names[p] for p in members])
            self.units.append(Unit(module, label, flat))
        self.unit_of: Dict[nn.Parameter, Unit] = {p: u for u in self.units for p in u.flat.params}
        self.slot = {p: (u.flat.offsets[i], p.numel()) for u in self.units for i, p in enumerate(u.flat.params)}
        for unit in self.units:
            self._free(unit)
        stepped = [u.shard for u in self.units] + ([self.persistent.data] if self.persistent else [])
        self.optimizer = MasterOptimizer(stepped, config.optimizer)
        # gradient shards
        dtype, device = params[0].dtype, params[0].device
        if self.opts["contiguous_gradients"]:
            self.shard_buffer = torch.zeros(sum(u.flat.shard_numel for u in self.units), dtype=dtype, device=device)
            self.grad_shards: List[Optional[torch.Tensor]] = []
            offset = 0
            for u in self.units:
                self.grad_shards.append(self.shard_buffer[offset:offset + u.flat.shard_numel])
                offset += u.flat.shard_numel
        else:
            self.shard_buffer = None
            self.grad_shards = [None] * len(self.units)
        self.persistent_grad: Optional[torch.Tensor] = None
        self._written = [False] * len(self.units)
        self._in_flight: list = []
        self._in_flight_numel = 0
        #: unit indices in the order their forward / backward began, recorded once (for prefetch)
        self.forward_order: Optional[List[int]] = None
        self.backward_order: Optional[List[int]] = None
        self._forward_seen: List[int] = []
        self._backward_seen: List[int] = []
        self._callback_queued = False
        self._finished = False
        self._hooks = []
        for unit in self.units:
            self._hooks.append(unit.module.register_forward_pre_hook(
                lambda m, args, unit=unit: self._pre_forward(unit)))
            self._hooks.append(unit.module.register_forward_hook(
                lambda m, args, out, unit=unit: self._post_forward(unit, out)))
        for p in params:
            self._hooks.append(p.register_post_accumulate_grad_hook(self._on_gradient_ready))

    # -- gathering and freeing ---------------------------------------------------------
    def _gather(self, unit: Unit, async_op: bool) -> None:
        if unit.state is not State.FREE:
            return
        unit.flat.materialize()
        unit.gather_work = comm.all_gather(unit.flat.data, unit.shard, group=self.group, async_op=True,
                                           tag=f"params {unit.label}")
        unit.state = State.GATHERING
        if not async_op:
            self._wait_gathered(unit)

    def _wait_gathered(self, unit: Unit) -> None:
        if unit.state is State.GATHERING:
            unit.gather_work.wait()
            unit.gather_work = None
            unit.state = State.GATHERED

    def _free(self, unit: Unit) -> None:
        self._wait_gathered(unit)
        unit.flat.free()
        unit.state = State.FREE

    def _prefetch(self, order: Optional[List[int]], current: Unit) -> None:
        """Launch the gathers of the units after ``current`` in ``order``, up to prefetch_bucket_size elements."""
        if not self.opts["prefetch"] or order is None or current.index not in order:
            return
        budget = int(self.opts["prefetch_bucket_size"])
        for index in order[order.index(current.index) + 1:]:
            unit = self.units[index]
            if unit.state is not State.FREE:
                continue
            budget -= unit.flat.padded_numel
            if budget < 0:
                break
            self._gather(unit, async_op=True)

    # -- forward -------------------------------------------------------------------
    def _pre_forward(self, unit: Unit) -> None:
        if torch.is_grad_enabled():
            self._forward_seen.append(unit.index)
        self._gather(unit, async_op=True)
        self._prefetch(self.forward_order, unit)
        self._wait_gathered(unit)

    def _post_forward(self, unit: Unit, output) -> None:
        if not torch.is_grad_enabled():
            return
        tensors = [t for t in tree_flatten(output)[0] if torch.is_tensor(t) and t.requires_grad]
        for t in tensors:
            t.register_hook(lambda grad, unit=unit: self._pre_backward(unit))
        if self.opts["reshard_after_forward"]:
            self._free(unit)

    # -- backward ------------------------------------------------------------------
    def _queue_finish(self) -> None:
        if not self._callback_queued:
            Variable._execution_engine.queue_callback(self._finish_backward)
            self._callback_queued = True

    def _pre_backward(self, unit: Unit) -> None:
        """A hook on the gradient of the unit's output: its backward is next, so gather it."""
        self._queue_finish()
        if unit.backward_started:
            return
        unit.backward_started = True
        self._backward_seen.append(unit.index)
        self._gather(unit, async_op=True)
        self._prefetch(self.backward_order, unit)
        self._wait_gathered(unit)

    @torch.no_grad()
    def _on_gradient_ready(self, p) -> None:
        self._queue_finish()
        unit = self.unit_of.get(p)
        if unit is None:
            return  # persistent: its gradient stays in p.grad until the end of backward
        if unit.bucket is None:
            unit.bucket = unit.flat.new_bucket()
        offset, numel = self.slot[p]
        view = unit.bucket[offset:offset + numel].view_as(p)
        if p in unit.arrived:
            view.add_(p.grad)
        else:
            view.copy_(p.grad)
            unit.arrived.add(p)
        p.grad = None
        if len(unit.arrived) == len(unit.flat.params):
            self._post_backward(unit)

    def _post_backward(self, unit: Unit) -> None:
        """Every gradient of the unit is in its bucket: reduce-scatter it, free the bucket and the parameters."""
        if unit.reduced:
            return
        unit.reduced = True
        if unit.bucket is None:
            unit.bucket = unit.flat.new_flat()  # no gradient came: reduce zeros, in lockstep
        elif len(unit.arrived) < len(unit.flat.params):
            unit.flat.zero_slots(unit.bucket, set(unit.flat.params) - unit.arrived)
        if unit.state is not State.FREE:
            self._free(unit)
        i = unit.index
        if self.grad_shards[i] is None:
            self.grad_shards[i] = unit.flat.new_shard()
        first = not self._written[i]
        self._written[i] = True
        out = self.grad_shards[i] if first else unit.flat.new_shard()
        bucket, unit.bucket = unit.bucket, None
        bucket.div_(self.world)
        overlap = self.opts["overlap_comm"]
        limit = int(self.opts["reduce_bucket_size"])
        self._reap()
        while self._in_flight and self._in_flight_numel + bucket.numel() > limit:
            self._complete(self._in_flight.pop(0))
        work = comm.reduce_scatter(out, bucket, group=self.group, async_op=overlap, tag=f"grads {unit.label}")
        flight = [work, bucket, out, None if first else self.grad_shards[i]]
        if overlap:
            self._in_flight.append(flight)
            self._in_flight_numel += bucket.numel()
        else:
            self._complete(flight, counted=False)

    def _reap(self) -> None:
        """Release the buckets of reduce-scatters that have finished, without waiting for any."""
        while self._in_flight and (self._in_flight[0][0] is None or self._in_flight[0][0].is_completed()):
            self._complete(self._in_flight.pop(0))

    def _complete(self, flight, counted: bool = True) -> None:
        work, bucket, out, accumulate_into = flight
        if work is not None:
            work.wait()
        if accumulate_into is not None:
            accumulate_into.add_(out)
        if counted:
            self._in_flight_numel -= bucket.numel()
        flight[1] = flight[2] = None

    @torch.no_grad()
    def _reduce_persistent(self) -> None:
        """All-reduce the persistent parameters' gradients of this micro-batch and add them to the step's."""
        unit = self.persistent
        flat = unit.new_flat()
        for p, view in zip(unit.params, unit.views(flat)):
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = None
        flat.div_(self.world)
        comm.all_reduce(flat, group=self.group, tag="persistent grads")
        if self.persistent_grad is None:
            self.persistent_grad = flat
        else:
            self.persistent_grad.add_(flat)

    def _finish_backward(self) -> None:
        """After the whole backward: reduce every unit not reduced yet (in unit order), wait for all."""
        for unit in self.units:
            self._post_backward(unit)
        while self._in_flight:
            self._complete(self._in_flight.pop(0))
        if self.persistent is not None:
            self._reduce_persistent()
        for unit in self.units:
            unit.arrived.clear()
            unit.backward_started = False
            unit.reduced = False
        if self.forward_order is None and self._forward_seen:
            self.forward_order = list(dict.fromkeys(self._forward_seen))
            self.backward_order = list(dict.fromkeys(self._backward_seen))
        self._forward_seen, self._backward_seen = [], []
        self._callback_queued = False
        self._finished = True

    # -- the loop --------------------------------------------------------------------
    def backward(self, loss):
        self._finished = False
        loss.backward()
        if not self._finished:
            self._finish_backward()

    @contextmanager
    def no_sync(self):
        """ZeRO-3 reduces every micro-batch: a rank keeps no gradients it does not own (FACTS §2)."""
        yield

    def step(self):
        grads = list(self.grad_shards) + ([self.persistent_grad] if self.persistent is not None else [])
        self.optimizer.step(grads)

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
        was_free = [u for u in self.units if u.state is State.FREE]
        for unit in was_free:
            self._gather(unit, async_op=False)
        try:
            yield
        finally:
            for unit in was_free:
                self._free(unit)

    def full_parameters(self):
        with self.gathered():
            return {n: p.detach().float().cpu().clone() for n, p in self.model.named_parameters()}

    # -- measurement -----------------------------------------------------------------
    def track_memory(self, ledger):
        super().track_memory(ledger)
        ledger.track("params", lambda: [u.shard for u in self.units])
        ledger.track_optimizer(self.optimizer.optimizer)

        def gradient_memory():
            yield from (s for s in self.grad_shards if s is not None)
            if self.persistent_grad is not None:
                yield self.persistent_grad
            yield from (u.bucket for u in self.units if u.bucket is not None)
            for _, bucket, out, _ in self._in_flight:
                yield from (t for t in (bucket, out) if t is not None)

        ledger.track("grads", gradient_memory)

    def flat_units(self):
        return [u.flat.numel for u in self.units]

    def persistent_numel(self) -> int:
        return self.persistent.numel if self.persistent is not None else 0

    def optimizer_tensors(self):
        return self.optimizer.step_scalars

    def theory_model_states(self, psi):
        return theory.model_state_bytes(3, psi, self.world, self.config.precision, self.config.optimizer.name,
                                        units=self.flat_units(), optimizer_tensors=self.optimizer_tensors(),
                                        persistent_numel=self.persistent_numel())

    def theory_comm_bytes(self, psi):
        b = theory.param_bytes_per_element(self.config.precision)
        return theory.comm_bytes_per_step(3, psi, self.world, b, self.config.micro_batches, units=self.flat_units(),
                                          persistent_numel=self.persistent_numel(),
                                          reshard_after_forward=self.opts["reshard_after_forward"])
