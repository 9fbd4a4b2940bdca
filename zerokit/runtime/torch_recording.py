"""Counting a peer library's collectives in zerokit's ledger: the hooks.

Two ways in, by how the library communicates: wrappers around the ``torch.distributed``
functions (FSDP2, DeepSpeed, ZeroRedundancyOptimizer), and a dispatch mode that sees the
functional collectives DTensor issues (torch's tensor parallelism).

FSDP2 and DeepSpeed have no comm hook, so zerokit cannot route their traffic through
:mod:`.comm` the way ``torch-ddp`` does. Instead, the lifecycle of every
forward, backward and step of a peer (:class:`zerokit.peers.recording.Peer`) is:

1. **enter** :func:`ledgered_torch_collectives`: the ``torch.distributed`` collectives
   (``all_reduce``, ``broadcast``, ``all_gather_single`` / ``all_gather_into_tensor``,
   ``reduce_scatter_single`` / ``reduce_scatter_tensor``, the list forms), in both
   ``torch.distributed`` and ``distributed_c10d``, are replaced by wrappers;
2. **run** the library: each call the library makes is recorded in the ledger with the
   same ring formula zerokit's own collectives use, then the original is called (a
   collective the library makes from inside another one is not counted twice);
3. **leave**: the originals are put back.

Their async work is not timed (no blocked seconds): a peer's exposed communication is
not visible to the ledger. Setup (``fully_shard``, ``deepspeed.initialize``) runs inside
the same context under ``comm.phase("setup")``, so its broadcasts are counted apart.
"""
from __future__ import annotations

import sys
import threading
import weakref
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.utils._python_dispatch import TorchDispatchMode

from . import clock, comm

_inside = threading.local()


def _payload(op: str, args, kwargs):
    """(tensor, payload bytes) of a torch.distributed call, by zerokit's convention."""
    def arg(i, name):
        return args[i] if len(args) > i else kwargs[name]

    if op in ("all_reduce", "broadcast"):
        t = arg(0, "tensor")
        return t, t.numel() * t.element_size()
    if op == "all_gather_single":
        t = arg(0, "output_tensor")
        return t, t.numel() * t.element_size()
    if op == "reduce_scatter_single":
        t = arg(1, "input")
        return t, t.numel() * t.element_size()
    if op == "all_gather":
        ts = arg(0, "tensor_list")
        return ts[0], sum(t.numel() * t.element_size() for t in ts)
    if op == "reduce_scatter":
        ts = arg(1, "input_list")
        return ts[0], sum(t.numel() * t.element_size() for t in ts)
    raise ValueError(op)


_RECORDED_AS = {"all_reduce": "all_reduce", "broadcast": "broadcast", "all_gather_single": "all_gather",
                "reduce_scatter_single": "reduce_scatter", "all_gather": "all_gather",
                "reduce_scatter": "reduce_scatter"}


def _from_zerokit_comm() -> bool:
    """Whether the caller is zerokit.runtime.comm itself (it records its own calls: a second record would count the
    bytes twice when a torch library and zerokit's collectives share the block, as under zerokit.measure)."""
    return sys._getframe(2).f_globals.get("__name__") == "zerokit.runtime.comm"


def _recording(op: str, original, tag: str):
    def wrapper(*args, **kwargs):
        if getattr(_inside, "active", False) or _from_zerokit_comm():
            return original(*args, **kwargs)
        tensor, nbytes = _payload(op, args, kwargs)
        group = kwargs.get("group", args[2] if op == "broadcast" and len(args) > 2 else None)
        if op in ("all_reduce",) and len(args) > 2:
            group = args[2]
        async_op = kwargs.get("async_op", False)
        extra = {}
        if op == "broadcast":
            src = args[1] if len(args) > 1 else kwargs.get("src", kwargs.get("group_src", 0))
            extra = {"rank": dist.get_rank(group), "src": dist.get_group_rank(group, src) if group else src}
        record = comm.new_record(_RECORDED_AS[op], tensor, nbytes, group, async_op, tag=f"{tag} {op}", **extra)
        _inside.active = True
        try:
            work = original(*args, **kwargs)
        finally:
            _inside.active = False
        if not async_op:
            record.t_end = clock.mark()
            record.add_blocked(record.t_launch, record.t_end)
        return work

    return wrapper


def _recording_p2p(original, tag: str):
    """``batch_isend_irecv`` (torch's pipelining): one ``send`` or ``recv`` record per operation in the batch."""
    def wrapper(ops, *args, **kwargs):
        if getattr(_inside, "active", False) or _from_zerokit_comm():
            return original(ops, *args, **kwargs)
        for op in ops:
            kind = "send" if "send" in getattr(op.op, "__name__", "") else "recv"
            comm.new_record(kind, op.tensor, op.tensor.numel() * op.tensor.element_size(), op.group, True,
                            tag=f"{tag} batch_isend_irecv")
        _inside.active = True
        try:
            return original(ops, *args, **kwargs)
        finally:
            _inside.active = False

    return wrapper


def _recording_point(op: str, original, tag: str):
    """``isend`` / ``irecv`` called one by one (torch's pipelining does for batches of one direction)."""
    def wrapper(tensor, *args, **kwargs):
        if getattr(_inside, "active", False) or _from_zerokit_comm():
            return original(tensor, *args, **kwargs)
        group = kwargs.get("group", args[1] if len(args) > 1 else None)
        comm.new_record("send" if op == "isend" else "recv", tensor, tensor.numel() * tensor.element_size(),
                        group, True, tag=f"{tag} {op}")
        _inside.active = True
        try:
            return original(tensor, *args, **kwargs)
        finally:
            _inside.active = False

    wrapper.__name__ = op
    return wrapper


@contextmanager
def ledgered_torch_collectives(tag: str):
    """Route a library's torch.distributed collectives (and batched point-to-point) through the ledger while
    the block runs."""
    saved = []
    for op in _RECORDED_AS:
        for module in (dist, c10d):
            original = getattr(module, op, None)
            if original is None:
                continue
            saved.append((module, op, original))
            setattr(module, op, _recording(op, original, tag))
    # one wrapper object on both modules: torch checks a P2POp's op by identity against c10d's isend / irecv
    for op, make in (("batch_isend_irecv", _recording_p2p), ("isend", None), ("irecv", None)):
        original = getattr(c10d, op)
        wrapper = make(original, tag) if make else _recording_point(op, original, tag)
        for module in (dist, c10d):
            saved.append((module, op, getattr(module, op)))
            setattr(module, op, wrapper)
    try:
        yield
    finally:
        for module, op, original in saved:
            setattr(module, op, original)


def ledgered_allreduce_hook(state, bucket):
    """torch DDP's default comm hook (divide by N, all-reduce), routed through zerokit.comm; ``state``: None, or an
    object told about each bucket (``state.file(bucket)``: :class:`zerokit.peers.torch_ddp.BucketBuffers`)."""
    if state is not None:
        state.file(bucket)
    group = dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(group))
    work = comm.all_reduce(tensor, group=None, async_op=True, tag="torch-ddp bucket")
    record = work.record

    def done(fut):
        record.t_end = clock.mark()  # NCCL runs a future's callbacks on a stream that waited for the collective
        return fut.value()[0]

    return work._work.get_future().then(done)


# --- the traffic: functional collectives into zerokit's ledger --------------------------------------

_FUNCOL = torch.ops._c10d_functional
#: functional collective -> (zerokit's op name, payload rule): "input" the input tensor's bytes, "output" the
#: gathered output's (input × group size)
_RECORDED = {
    _FUNCOL.all_reduce: ("all_reduce", "input"),
    _FUNCOL.all_reduce_: ("all_reduce", "input"),
    _FUNCOL.all_gather_into_tensor: ("all_gather", "output"),
    _FUNCOL.reduce_scatter_tensor: ("reduce_scatter", "input"),
    _FUNCOL.broadcast: ("broadcast", "input"),
}
_AUTOGRAD = getattr(torch.ops, "_c10d_functional_autograd", None)
if _AUTOGRAD is not None:
    for _name, _rule in (("all_gather_into_tensor", ("all_gather", "output")),
                         ("reduce_scatter_tensor", ("reduce_scatter", "input"))):
        if hasattr(_AUTOGRAD, _name):
            _RECORDED[getattr(_AUTOGRAD, _name)] = _rule
#: functional collectives with no ring formula in zerokit's ledger: refused loudly rather than dropped
_UNRECORDABLE = {_FUNCOL.all_to_all_single, _FUNCOL.all_reduce_coalesced, _FUNCOL.all_gather_into_tensor_coalesced,
                 _FUNCOL.reduce_scatter_tensor_coalesced}


class LedgeredFunctionalCollectives(TorchDispatchMode):
    """Record every functional collective (DTensor's communication) in zerokit's ledger, on one mesh axis.

    A ``TorchDispatchMode`` sees the ops below DTensor: DTensor's own dispatch is let
    through (``NotImplemented``) and desugars into ``_c10d_functional`` ops on plain
    local tensors, which are recorded here with their payload, then run. The group of
    each op must be the ``axis`` group of this rank's mesh.
    """

    def __init__(self, mesh, axis: str, tag: str):
        super().__init__()
        self.mesh = mesh
        self.axis = axis
        self.tag = tag
        self._ranks = mesh.ranks(axis)
        self._checked: set = set()
        #: id(output tensor) -> (weakref to it, its record): the wait that blocks on it is timed
        self._pending: dict = {}
        self._inside = False

    def _group(self, group_name):
        if group_name not in self._checked:
            pg = dist.distributed_c10d._resolve_process_group(group_name)
            ranks = dist.get_process_group_ranks(pg)
            if list(ranks) != list(self._ranks):
                raise RuntimeError(f"torch-tp: a functional collective ran on ranks {ranks}, not on this rank's "
                                   f"{self.axis} group {self._ranks}")
            self._checked.add(group_name)
        return self.mesh.group(self.axis)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor desugar into ops on local tensors (and collectives) first
        packet = func._overloadpacket
        if packet is _FUNCOL.wait_tensor:
            entry = self._pending.pop(id(args[0]), None)
            t0 = clock.mark()
            out = func(*args, **kwargs)
            if entry is not None and entry[0]() is args[0]:
                record = entry[1]
                record.t_end = clock.mark()
                record.add_blocked(t0, record.t_end)
            return out
        if packet in _UNRECORDABLE and not self._inside:
            raise RuntimeError(f"torch-tp: DTensor issued {packet}, which zerokit's ledger has no ring formula "
                               f"for; refusing to drop its traffic silently")
        rule = _RECORDED.get(packet)
        if rule is None or self._inside:
            return func(*args, **kwargs)
        op, payload = rule
        tensor = args[0]
        group_name = args[-1] if isinstance(args[-1], str) else kwargs.get("group_name")
        group = self._group(group_name)
        nbytes = tensor.numel() * tensor.element_size()
        if payload == "output":
            nbytes *= len(self._ranks)
        extra = {}
        if op == "broadcast":
            extra = {"rank": self._ranks.index(dist.get_rank()), "src": int(args[1])}
        record = comm.new_record(op, tensor, nbytes, group, True, tag=f"{self.tag} {packet._qualified_op_name}",
                                 **extra)
        return self.run_recorded(func, args, kwargs, record)

    def run_recorded(self, func, args, kwargs, record):
        """Run the functional collective ``func`` for ``record``: the time its call blocks, and its output kept
        so that the wait that blocks on it is timed too."""
        t0 = clock.mark()
        self._inside = True
        try:
            out = func(*args, **kwargs)
        finally:
            self._inside = False
        record.add_blocked(t0, clock.mark())
        if isinstance(out, torch.Tensor):
            self._pending[id(out)] = (weakref.ref(out), record)
        return out
