"""Counting a peer library's collectives in zerokit's ledger.

FSDP2 and DeepSpeed have no comm hook, so zerokit cannot route their traffic through
:mod:`zerokit.runtime.comm` the way ``torch-ddp`` does. Instead, the lifecycle of every
forward, backward and step of a peer (:class:`Peer`) is:

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

import threading
import time
from contextlib import contextmanager

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..runtime import comm
from ..strategies.base import Strategy

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


def _recording(op: str, original, tag: str):
    def wrapper(*args, **kwargs):
        if getattr(_inside, "active", False):
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
        record = comm._start(_RECORDED_AS[op], tensor, nbytes, group, async_op, tag=f"{tag} {op}", **extra)
        _inside.active = True
        try:
            work = original(*args, **kwargs)
        finally:
            _inside.active = False
        if not async_op:
            record.t_end = time.perf_counter()
            record.blocked_s = record.t_end - record.t_launch
        return work

    return wrapper


@contextmanager
def ledgered_torch_collectives(tag: str):
    """Route a library's torch.distributed collectives through the ledger while the block runs."""
    saved = []
    for op in _RECORDED_AS:
        for module in (dist, c10d):
            original = getattr(module, op, None)
            if original is None:
                continue
            saved.append((module, op, original))
            setattr(module, op, _recording(op, original, tag))
    try:
        yield
    finally:
        for module, op, original in saved:
            setattr(module, op, original)


class Peer(Strategy):
    """A library's strategy whose collectives are counted by :func:`ledgered_torch_collectives`.

    Subclasses implement ``run_step`` (and ``run_forward`` / ``run_backward`` where the
    library wraps the model); the loop's ``forward`` / ``backward`` / ``step`` run them
    inside the recording context.
    """

    peer = True

    def forward(self, inputs):
        with ledgered_torch_collectives(self.name):
            return self.run_forward(inputs)

    def backward(self, loss):
        with ledgered_torch_collectives(self.name):
            self.run_backward(loss)

    def step(self):
        with ledgered_torch_collectives(self.name):
            self.run_step()

    def run_forward(self, inputs):
        return self.model(inputs)

    def run_backward(self, loss):
        loss.backward()

    def run_step(self):
        raise NotImplementedError


def fp32_only(name: str, config) -> None:
    """Refuse bf16-mixed for a peer that steps the model's own parameters."""
    if config.precision != "fp32":
        raise ValueError(f"strategy {name!r} runs in fp32 only: it steps the model's own parameters, with no fp32 "
                         f"master copy to make bf16-mixed comparable; use precision='fp32'")
