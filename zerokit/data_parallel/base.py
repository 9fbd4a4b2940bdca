"""What every data-parallel strategy shares: :class:`DataParallel` (``ddp-naive``'s class, which ``naive.py``
registers) and the start check that every rank holds the same parameters (:func:`check_replicas_match`).

The full model on every rank, each training on its share of the global batch; after backward each rank's gradients
are averaged over the N ranks, so every rank takes the same optimizer step (ZeRO §2.1). The variants
(:mod:`.bucketed`, :mod:`.overlap`) subclass :class:`DataParallel` and change how the averaging is cut up and when it
runs; ZeRO (:mod:`zerokit.zero`) reuses the start check. :mod:`.naive` tells the lesson of the plainest form.
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist

from .. import theory
from ..runtime import comm
from ..runtime.replicas import parameter_checksums
from ..runtime.ring import ring_all_reduce
from ..strategies.base import Option, Replicated, boolean

ALGORITHMS = ("torch", "ring")


def one_of(*choices):
    def check(value) -> bool:
        return isinstance(value, str) and value in choices
    return check


def check_replicas_match(model: torch.nn.Module, group=None, device=None, experts: bool = False) -> None:
    """All-gather every rank's parameter checksums (phase "setup") and fail if any rank differs from rank 0
    (``experts``: the expert-parallel experts', over the group that holds the same ones)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    n = dist.get_world_size(group)
    if n == 1:
        return
    mine = parameter_checksums(model, experts)
    if device is not None:
        mine = mine.to(device)
    gathered = torch.empty(n * mine.numel(), dtype=torch.float64, device=mine.device)
    with comm.phase("setup"):
        comm.all_gather(gathered, mine, group=group, tag="start checksum")
    rows = gathered.cpu().view(n, -1)
    names = [name for name, p in model.named_parameters() if getattr(p, "_zerokit_expert", False) == experts]
    for r in range(1, n):
        same = (rows[r] == rows[0]) | (rows[r].isnan() & rows[0].isnan())
        if not bool(same.all()):
            first = int((~same).nonzero()[0])
            name = names[first // 2]
            raise ValueError(
                f"rank {r}'s parameters differ from rank 0's at start: {name!r} has checksum "
                f"{float(rows[r][first]):.17g} on rank {r} but {float(rows[0][first]):.17g} on rank 0. "
                f"Data parallelism needs identical replicas: build the model from the same seed on every "
                f"rank, or broadcast rank 0's parameters before training.")


class DataParallel(Replicated):
    """``ddp-naive``: the full model on every rank; after backward one all-reduce per parameter."""

    #: data parallelism over the tensor-parallel shards when the mesh has tp > 1 (2-D parallelism)
    axes = ("dp", "cp", "tp")
    name = "ddp-naive"
    stage = 0
    options = {
        "algorithm": Option("torch", one_of(*ALGORITHMS),
                            "'torch' (the backend's all-reduce) or 'ring' (zerokit.ring on send/recv)"),
        "find_unused_parameters": Option(False, boolean,
                                         "True (reduce zeros for parameters that got no gradient) or False "
                                         "(raise naming them)"),
    }

    def __init__(self, model, ctx, config, **options):
        super().__init__(model, ctx, config, **options)
        check_replicas_match(model, self.group, ctx.device)
        if ctx.mesh.size("ep") > 1:  # the experts: equal across the ranks that hold the same ones
            check_replicas_match(model, ctx.mesh.group("edp"), ctx.device, experts=True)
        self.param_names = {p: n for n, p in model.named_parameters() if p.requires_grad}

    # -- the reduction ---------------------------------------------------------------
    def average_experts(self, tensor: torch.Tensor, tag: str = "", async_op: bool = False) -> Optional[comm.Work]:
        """Experts' gradients: each already holds the sum over its ep group's tokens (the combine's backward brought
        them), so divide by N and sum over the ranks holding the same experts (``edp``, N / ep of them)."""
        tensor.div_(self.world)
        group = self.ctx.mesh.group("edp")
        if self.ctx.mesh.size("edp") == 1:
            return None
        return comm.all_reduce(tensor, group=group, async_op=async_op, tag=f"experts {tag}")

    def average(self, tensor: torch.Tensor, tag: str = "", async_op: bool = False) -> Optional[comm.Work]:
        """Divide by N, then sum over the ranks in place: every rank ends with the mean."""
        tensor.div_(self.world)
        if self.opts["algorithm"] == "ring":
            ring_all_reduce(tensor, group=self.group, tag=tag)
            return None
        return comm.all_reduce(tensor, group=self.group, async_op=async_op, tag=tag)

    def missing_gradients(self, params) -> List[torch.nn.Parameter]:
        """The parameters that require grad but have none after this step's backward."""
        return [p for p in params if p.grad is None]

    def handle_unused(self, unused) -> None:
        """Raise naming the unused parameters, or (find_unused_parameters) let them count as zeros."""
        if not unused:
            return
        if not self.opts["find_unused_parameters"]:
            names = ", ".join(repr(self.param_names[p]) for p in unused)
            raise ValueError(
                f"strategy {self.name!r}: rank {self.ctx.rank}: parameters {names} require grad but received "
                f"no gradient this step (not used in forward). Pass find_unused_parameters=True to reduce zeros "
                f"for them, or set requires_grad=False on them, or remove them from the model.")

    def reduce_gradients(self) -> None:
        unused = self.missing_gradients(self.params)
        self.handle_unused(unused)
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.average(p.grad, tag=f"grad {self.param_names[p]}")

    # -- the loop --------------------------------------------------------------------
    def backward(self, loss):
        loss.backward()
        if self._sync:
            self.reduce_gradients()

    # -- measurement -----------------------------------------------------------------
    def reduction_units(self) -> List[int]:
        """Elements of each tensor one all-reduce reduces (a parameter here, a bucket in the variants)."""
        return [p.numel() for p in self.params]

    def theory_comm_bytes(self, psi):
        """2(N−1)/N·Ψb over the parameters that require grad (frozen ones are never reduced; an expert-parallel
        expert is reduced over its own group, counted on that axis).

        The ring pads each reduced tensor to a multiple of N and counts the padding.
        """
        b = theory.param_bytes_per_element(self.config.precision)
        n = self.world
        if self.opts["algorithm"] != "ring":
            trainable = sum(p.numel() for p in self.params if not getattr(p, "_zerokit_expert", False))
            return theory.comm_bytes_per_step(0, trainable, n, b, self.config.micro_batches)
        return sum(theory.ring_bytes_sent("all_reduce", theory.padded_numel([u], n) * b, n)
                   for u in self.reduction_units())

    def theory_expert_comm_bytes(self):
        """Formula: bytes per step on edp, the experts' all-reduce (0 without expert parallelism), as ZeRO's twin."""
        experts = sum(p.numel() for p in self.params if getattr(p, "_zerokit_expert", False))
        if not experts or self.ctx.mesh.size("edp") == 1:
            return 0
        b = theory.param_bytes_per_element(self.config.precision)
        return theory.ring_bytes_sent("all_reduce", experts * b, self.ctx.mesh.size("edp"))
