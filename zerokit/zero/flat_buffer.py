"""Flat, padded, sharded buffers: the storage layout of ZeRO (arXiv 1910.02054 §5) and FSDP.

A *unit* is a group of parameters of one dtype and device whose data live in one
flat buffer. The buffer is padded with zeros to a multiple of N, so that it splits
into N equal shards of ``s = ceil(numel / N)`` elements (gloo's reduce-scatter refuses
uneven inputs, FACTS §9), and rank r owns the contiguous shard ``[r·s, (r+1)·s)``. Every
unit has its own buffer, so a unit's reduce-scatter lands exactly on its owners' shards.

Each parameter becomes a view into its unit's buffer (``p.data = buffer[o:o + numel]``),
so the memory ledger, which counts storages, counts the buffer once, padding included.
``free`` really releases the memory — the storage is resized to 0 bytes, the ledger
then counts 0 — and ``materialize`` allocates it again (contents undefined until
written, by an all-gather, say). The views, and the tensors autograd saved for
backward, share that storage, so they see the new memory as soon as it is back: this
is how ZeRO-3 gathers a unit before its forward and frees it after.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch

from ..runtime import comm
from ..runtime.ring import ring_all_gather


def check_world_size(psi: int, world_size: int) -> None:
    """ZeRO shards Ψ elements over N ranks: more ranks than elements leaves a rank nothing to own."""
    if world_size > psi:
        raise ValueError(f"world size {world_size} is larger than the parameter count {psi}: every rank must own "
                         f"at least one element of the model; use at most {psi} ranks")


def check_trainable(model: torch.nn.Module, strategy: str) -> List[torch.nn.Parameter]:
    """The parameters ZeRO shards: those that require grad. A frozen one (``requires_grad=False``) is held whole
    on every rank, like a buffer: it has no gradient to reduce and no optimizer state to shard."""
    named = list(model.named_parameters())
    trainable = [p for _, p in named if p.requires_grad]
    if not trainable:
        raise ValueError(f"strategy {strategy!r}: the model has no parameters that require grad, nothing to shard")
    return trainable


def check_elements(name: str, value) -> int:
    """A size in elements (DeepSpeed's unit): a positive integer, or a float with an integral value (5e8)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0 \
            or value != int(value):
        raise ValueError(f"{name}={value!r} must be a positive whole number of elements")
    return int(value)


def assign_units(params: Sequence[torch.Tensor], max_numel: int, key=None) -> List[List[int]]:
    """Indices into ``params``, unit by unit, in reverse registration order (the order backward produces them).

    DeepSpeed's bucket rule: a unit takes tensors while their total stays within
    ``max_numel`` elements; a tensor larger than that gets a unit of its own.
    ``key(param)``: tensors of different keys never share a unit (expert parameters, sharded over
    their own group: :mod:`.experts`); each key fills its own units by the same rule, and the units
    are ordered by their last tensor in backward order (the order they fill).
    """
    units: List[List[int]] = []
    open_units: dict = {}  # key -> (indices, elements)
    for i in reversed(range(len(params))):
        numel = params[i].numel()
        kind = None if key is None else key(params[i])
        current, size = open_units.get(kind, ([], 0))
        if current and size + numel > max_numel:
            units.append(current)
            current, size = [], 0
        current.append(i)
        open_units[kind] = (current, size + numel)
    units.extend(current for current, _ in open_units.values())
    return sorted(units, key=lambda unit: -unit[-1])


def free_storage(t: torch.Tensor) -> None:
    """Release ``t``'s memory: its storage is resized to 0 bytes (views of it stay, pointing at nothing)."""
    storage = t.untyped_storage()
    if storage.nbytes():
        storage.resize_(0)


def alloc_storage(t: torch.Tensor) -> None:
    """Give a freed ``t`` its memory back (contents undefined until written)."""
    storage = t.untyped_storage()
    need = t.numel() * t.element_size()
    if storage.nbytes() != need:
        storage.resize_(need)


class FlatUnit:
    """One unit: its parameters as views into a flat buffer padded to a multiple of N.

    ``data`` is the full padded buffer; ``shard(t)`` is rank ``rank``'s slice of any
    flat tensor with this layout (the parameter buffer, a gradient buffer).
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], world_size: int, rank: int, index: int = 0,
                 names: Sequence[str] = (), compute_dtype: Optional[torch.dtype] = None,
                 reduce_dtype: Optional[torch.dtype] = None, expert: bool = False):
        if not params:
            raise ValueError("a flat unit needs at least one parameter")
        dtypes = {p.dtype for p in params}
        devices = {p.device for p in params}
        if len(dtypes) > 1 or len(devices) > 1:
            found = ", ".join(sorted(str(d).replace("torch.", "") for d in dtypes))
            raise ValueError(f"unit {index}: parameters of mixed dtypes or devices ({found}; "
                             f"{', '.join(sorted(map(str, devices)))}) cannot share one flat buffer; cast the model to "
                             f"one dtype (zerokit's bf16-mixed keeps fp32 masters in the optimizer, not the model)")
        self.index = index
        #: expert-parallel experts' parameters: sharded over the ranks holding the same experts (``edp``), not dp
        self.expert = expert
        self.params = list(params)
        self.names = list(names) or [f"param {i}" for i in range(len(self.params))]
        self.world_size = world_size
        self.rank = rank
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = -(-self.numel // world_size)
        self.padded_numel = self.shard_numel * world_size
        #: the parameters' own dtype: the shard's at rest and its gradient's (fp32 under a 16-bit compute dtype)
        self.rest_dtype = self.params[0].dtype
        #: the full buffer's dtype, what forward and backward compute in (FSDP2's ``param_dtype``)
        self.dtype = compute_dtype or self.rest_dtype
        #: the gradient buckets' dtype, what the reduce-scatter sums in (FSDP2's ``reduce_dtype``)
        self.reduce_dtype = reduce_dtype or self.dtype
        self.device = self.params[0].device
        self.offsets = []
        offset = 0
        for p in self.params:
            self.offsets.append(offset)
            offset += p.numel()
        rest = torch.zeros(self.padded_numel, dtype=self.rest_dtype, device=self.device)
        with torch.no_grad():
            for p, view in zip(self.params, self.views(rest)):
                view.copy_(p.detach())
            #: this rank's slice in the rest dtype, taken by :class:`~zerokit.zero.units.Unit` (None: a slice of data)
            self.rest_shard = self.shard(rest).clone() if self.dtype != self.rest_dtype else None
            self.data = rest if self.dtype == self.rest_dtype else rest.to(self.dtype)
            del rest
            for p, view in zip(self.params, self.views(self.data)):
                p.data = view

    # -- layout ---------------------------------------------------------------------
    @property
    def lo(self) -> int:
        return self.rank * self.shard_numel

    @property
    def hi(self) -> int:
        return self.lo + self.shard_numel

    def shard(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous 1/N of a flat tensor laid out like this unit (a view)."""
        return flat[self.lo:self.hi]

    def shard_layout(self) -> List[tuple]:
        """(start, end, parameter) of each parameter's elements in this rank's shard, in shard coordinates."""
        out = []
        for p, offset in zip(self.params, self.offsets):
            lo, hi = max(offset, self.lo), min(offset + p.numel(), self.hi)
            if lo < hi:
                out.append((lo - self.lo, hi - self.lo, p))
        return out

    def views(self, flat: torch.Tensor) -> List[torch.Tensor]:
        """One view per parameter into a flat tensor of this layout, shaped like the parameter."""
        return [flat[o:o + p.numel()].view_as(p) for p, o in zip(self.params, self.offsets)]

    def new_flat(self) -> torch.Tensor:
        """A zeroed flat tensor of this layout (a gradient bucket, say), in the reduce dtype."""
        return torch.zeros(self.padded_numel, dtype=self.reduce_dtype, device=self.device)

    def new_bucket(self) -> torch.Tensor:
        """An uninitialised flat tensor of this layout with its padding zeroed: every parameter's slot is
        written (or zeroed with :meth:`zero_slots`) before it is reduced."""
        flat = torch.empty(self.padded_numel, dtype=self.reduce_dtype, device=self.device)
        flat[self.numel:].zero_()
        return flat

    def zero_slots(self, flat: torch.Tensor, missing) -> None:
        """Zero the slots of the parameters in ``missing`` (they got no gradient)."""
        for p, view in zip(self.params, self.views(flat)):
            if p in missing:
                view.zero_()

    def new_shard(self) -> torch.Tensor:
        """A zeroed shard in the reduce dtype: what a reduce-scatter writes."""
        return torch.zeros(self.shard_numel, dtype=self.reduce_dtype, device=self.device)

    def new_grad_shard(self) -> torch.Tensor:
        """A zeroed gradient shard in the rest dtype: what the optimizer reads."""
        return torch.zeros(self.shard_numel, dtype=self.rest_dtype, device=self.device)

    # -- freeing --------------------------------------------------------------------
    def free(self) -> None:
        """Release the full buffer's memory (resize its storage to 0 bytes)."""
        free_storage(self.data)

    def materialize(self) -> None:
        """Allocate the full buffer's memory again; an all-gather fills it."""
        alloc_storage(self.data)

    @property
    def is_materialized(self) -> bool:
        return self.data.untyped_storage().nbytes() > 0

    def __repr__(self) -> str:
        return (f"FlatUnit({self.index}{' experts' if self.expert else ''}: {len(self.params)} tensors, "
                f"{self.numel} elements, padded to "
                f"{self.padded_numel} = {self.world_size} × {self.shard_numel})")


def all_gather_flat(output: torch.Tensor, shard: torch.Tensor, group, algorithm: str, async_op: bool, tag: str):
    """Gather every rank's ``shard`` into ``output``: the backend's all-gather, or zerokit's ring (synchronous)."""
    if algorithm == "ring":
        ring_all_gather(output, shard, group=group, tag=tag)
        return None
    return comm.all_gather(output, shard, group=group, async_op=async_op, tag=tag)


def all_gather_unit(unit: FlatUnit, shard: torch.Tensor, bucket_numel: int, group=None, tag: str = "",
                    async_op: bool = False, algorithm: str = "torch"):
    """Fill ``unit.data`` with every rank's shard (``shard`` is this rank's).

    One call when the whole buffer fits in ``bucket_numel`` elements (DeepSpeed's
    ``allgather_bucket_size``); otherwise chunk by chunk through a temporary buffer of at
    most ``bucket_numel`` elements. The bytes sent are (N−1)/N of the padded buffer
    either way. Returns the Work of an async single call, else None.
    """
    n = unit.world_size
    if unit.padded_numel <= bucket_numel:
        return all_gather_flat(unit.data, shard, group, algorithm, async_op, tag)
    chunk = max(1, bucket_numel // n)
    rows = unit.data.view(n, unit.shard_numel)
    for start in range(0, unit.shard_numel, chunk):
        k = min(chunk, unit.shard_numel - start)
        gathered = torch.empty(n * k, dtype=unit.dtype, device=unit.device)
        all_gather_flat(gathered, shard[start:start + k].contiguous(), group, algorithm, False, f"{tag} chunk")
        rows[:, start:start + k].copy_(gathered.view(n, k))
    return None
