"""Optimizers and mixed precision: the step every strategy shares.

``MasterOptimizer`` steps a list of parameter tensors (whole parameters for DDP,
flat shards for ZeRO) with a torch optimizer. In ``fp32`` the tensors are their own
master copy. In ``bf16-mixed`` (ZeRO §3.1, Micikevicius et al.) the model holds bf16
params and grads; the optimizer holds an fp32 master copy plus its states, so K = 12
bytes per parameter with Adam. Gradients are cast to fp32 for the step only and
dropped after it, so between steps the ledger sees bf16 grads alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from . import theory
from .runtime import comm
from .runtime.context import backend_device


@dataclass(frozen=True)
class OptimizerSpec:
    """Which optimizer steps a strategy's tensors: ``adamw`` or ``sgd`` with these hyperparameters, or any
    torch optimizer class (``optimizer_class`` with ``kwargs``: the own-loop API's ``ShardedOptimizer`` and
    ``initialize``); ``name`` is then the class's (its model-state formula is known for Adam(W) and SGD)."""

    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.0
    optimizer_class: Optional[type] = None
    kwargs: tuple = ()
    #: param groups with their own hyperparameters (``zerokit.initialize(optimizer=…)``): one (ids of the group's
    #: parameters, sorted (key, value) pairs) per group, in the given order; empty: every tensor with ``kwargs``
    groups: tuple = ()

    def __post_init__(self):
        if self.optimizer_class is None:
            theory.check_optimizer(self.name)
        elif not (isinstance(self.optimizer_class, type) and issubclass(self.optimizer_class, torch.optim.Optimizer)):
            raise ValueError(f"optimizer_class={self.optimizer_class!r} must be a torch.optim.Optimizer subclass, "
                             f"e.g. torch.optim.AdamW")
        if not isinstance(self.lr, (int, float)) or self.lr <= 0:
            raise ValueError(f"lr={self.lr!r} must be a positive number")

    @classmethod
    def of_class(cls, optimizer_class: type, **kwargs) -> "OptimizerSpec":
        """Any torch optimizer class with its keyword arguments (``lr`` among them, or the class's default)."""
        name = {torch.optim.AdamW: "adamw", torch.optim.Adam: "adamw" if not kwargs.get("weight_decay") else "adam",
                torch.optim.SGD: "sgd"}.get(optimizer_class, getattr(optimizer_class, "__name__", "custom").lower())
        lr = kwargs.get("lr", 1e-3)
        return cls(name=name, lr=float(lr) if isinstance(lr, (int, float)) else 1e-3, optimizer_class=optimizer_class,
                   kwargs=tuple(sorted(kwargs.items())))

    def group_of(self, param) -> int:
        """The index of the group ``param`` belongs to (the first when it is in none)."""
        return next((i for i, (ids, _) in enumerate(self.groups) if id(param) in ids), 0)

    def build_groups(self, pieces: Sequence[Sequence[torch.Tensor]]) -> torch.optim.Optimizer:
        """The optimizer over ``pieces[g]`` (the tensors stepped with group g's hyperparameters), one param group per
        group of :attr:`groups`, in their order — empty ones too, so a scheduler's per-group values line up."""
        first = [{"params": list(pieces[i]), **dict(hyper)} for i, (_, hyper) in enumerate(self.groups)]
        holder = next((g for g in first if g["params"]), None)
        if holder is None:
            raise ValueError("the optimizer's param groups hold none of this rank's tensors")
        optimizer = self.optimizer_class([holder], **dict(self.kwargs))
        optimizer.param_groups.clear()  # every group again, in the given order, each with its own values
        for group in first:
            optimizer.add_param_group(group)
        return optimizer

    def build(self, params) -> torch.optim.Optimizer:
        if self.optimizer_class is not None:
            try:
                return self.optimizer_class(params, **dict(self.kwargs))
            except TypeError as e:
                raise ValueError(f"{self.optimizer_class.__name__}(**{dict(self.kwargs)}) failed: {e}") from None
        params = list(params)
        # zerokit's choice: torch's fused kernel on a GPU (one launch for every tensor; Adam's step stays on the
        # device), the for-loop on the CPU (the reference's arithmetic, tensor by tensor)
        kernel = {"fused": True} if params and params[0].is_cuda else {"foreach": False}
        if self.name == "adamw":
            return torch.optim.AdamW(params, lr=self.lr, betas=self.betas, eps=self.eps,
                                     weight_decay=self.weight_decay, **kernel)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay, **kernel)


class GradientClipping:
    """DeepSpeed's ``gradient_clipping`` (torch's ``clip_grad_norm_``): before the step, every gradient is scaled by
    ``max_norm / (‖g‖ + 1e-6)`` when that is below 1, ‖g‖ the 2-norm of the whole model's gradient.

    A rank steps tensors that are either shards (ZeRO: the rank holds its part, the group holds the whole) or
    replicated (DDP, ZeRO-3's persistent parameters: every rank holds the same whole tensor). ‖g‖² is the sum of
    the shards' squares over the data-parallel ``group`` (one all-reduce of one number, phase ``step``) plus the
    replicated tensors' squares counted once. The padding of flat shards is zero and adds nothing."""

    def __init__(self, max_norm: float, sharded: Sequence[bool], group=None):
        """``group``: the data-parallel group the shards are spread over (None: the whole world)."""
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
            raise ValueError(f"gradient_clipping={max_norm!r} must be a positive number (0: no clipping)")
        self.max_norm, self.sharded, self.group = float(max_norm), list(sharded), group
        #: measured: the gradient norm before the last clipping
        self.last_norm: Optional[float] = None

    @torch.no_grad()
    def __call__(self, grads: Sequence[Optional[torch.Tensor]]) -> None:
        present = [(g, s) for g, s in zip(grads, self.sharded) if g is not None]
        if not present:
            return
        device = present[0][0].device
        shard_sq = torch.zeros((), dtype=torch.float32, device=device)
        whole_sq = torch.zeros((), dtype=torch.float32, device=device)
        for g, sharded in present:
            (shard_sq if sharded else whole_sq).add_(g.float().square().sum())
        import torch.distributed as dist

        if any(s for _, s in present) and dist.is_initialized() and comm._group_size(self.group) > 1:
            carried = shard_sq.to(backend_device(str(dist.get_backend(self.group))))  # NCCL: not a host tensor
            with comm.phase("step"):
                comm.all_reduce(carried, group=self.group, tag="gradient norm")
            shard_sq = carried.to(device)
        norm = (shard_sq + whole_sq).sqrt()
        self.last_norm = float(norm)
        coef = self.max_norm / (self.last_norm + 1e-6)
        if coef < 1:
            for g, _ in present:
                g.mul_(coef)


class MasterOptimizer:
    """A torch optimizer over ``tensors``, through fp32 master copies when they are 16-bit."""

    def __init__(self, tensors: Sequence[torch.Tensor], spec: OptimizerSpec, layout=None):
        """``layout``: per tensor, the (start, end, parameter) runs of its flat elements (a flat shard's
        :meth:`~zerokit.zero.flat_buffer.FlatUnit.shard_layout`); None: each tensor is one parameter. Read only when
        ``spec`` has param groups with their own hyperparameters."""
        self.tensors = list(tensors)
        self.mixed = any(t.dtype != torch.float32 for t in self.tensors)
        if self.mixed:
            self.masters = [torch.nn.Parameter(t.detach().float().clone()) for t in self.tensors]
        else:
            # nn.Parameter shares the tensor's storage: the optimizer updates it in place
            self.masters = [t if isinstance(t, torch.nn.Parameter) else torch.nn.Parameter(t.detach())
                            for t in self.tensors]
        #: per master, its (start, end, piece) runs of one param group each (None: the masters are stepped whole)
        self.pieces: Optional[list] = None
        if spec.groups:
            self.pieces = group_pieces(self.masters, self.tensors, spec, layout)
            by_group = [[] for _ in spec.groups]
            for runs in self.pieces:
                for _, _, piece, group in runs:
                    by_group[group].append(piece)
            self.optimizer = spec.build_groups(by_group)
        else:
            self.optimizer = spec.build(self.masters)
        #: :class:`GradientClipping` applied to the fp32 gradients before each step (None: none)
        self.clipping: Optional[GradientClipping] = None

    def step(self, grads: Sequence[torch.Tensor]) -> None:
        """One optimizer step with ``grads`` (one per tensor, any dtype; None skips it), then copy back."""
        previous = [master.grad for master in self.masters]
        for master, grad in zip(self.masters, grads):
            master.grad = grad if grad is None or grad.dtype == torch.float32 else grad.float()
        if self.clipping is not None:  # on fp32 copies or on the gradients themselves: scaled in place either way
            self.clipping([master.grad for master in self.masters])
        for master, runs in zip(self.masters, self.pieces or []):
            for start, end, piece, _ in runs:
                piece.grad = None if master.grad is None else master.grad.view(-1)[start:end]
        self.optimizer.step()
        for tensor, master, grad in zip(self.tensors, self.masters, previous):
            master.grad = grad  # a model parameter stepped as its own master keeps its .grad
            if self.mixed:
                with torch.no_grad():
                    tensor.copy_(master)

    @property
    def step_scalars(self) -> int:
        """Number of Adam ``step`` tensors held with the parameters (one per stepped tensor): on the CPU, and on a
        GPU for a fused or capturable Adam; torch's other Adam on a GPU keeps them on the host, where the device's
        model states do not count them."""
        if not isinstance(self.optimizer, torch.optim.Adam | torch.optim.AdamW):
            return 0
        stepped = sum(len(group["params"]) for group in self.optimizer.param_groups)
        return stepped if adam_steps_beside_params(self.optimizer) else 0


def group_pieces(masters, tensors, spec: OptimizerSpec, layout) -> list:
    """Each master cut into runs of consecutive elements whose parameters share a param group — DeepSpeed flattens
    each group on its own; zerokit's flat shards mix them, so each run is stepped as its own tensor (a view) with
    its group's hyperparameters. A shard's padding joins the run before it (zeros, with zero gradients)."""
    out = []
    for i, (master, tensor) in enumerate(zip(masters, tensors)):
        entries = layout[i] if layout is not None else [(0, tensor.numel(), tensor)]
        runs: list = []
        for start, end, param in entries:
            group = spec.group_of(param)
            if runs and runs[-1][2] == group and runs[-1][1] == start:
                runs[-1][1] = end
            else:
                runs.append([start, end, group])
        if runs:
            runs[-1][1] = master.numel()
        flat = master.detach().view(-1)
        out.append([(a, b, torch.nn.Parameter(flat[a:b]), g) for a, b, g in runs])
    return out


def adam_steps_beside_params(optimizer: torch.optim.Optimizer) -> bool:
    """Whether torch's Adam/AdamW keeps its ``step`` scalars on the parameters' device: always on the CPU; on a GPU
    only when ``fused`` or ``capturable`` (otherwise it makes them host tensors, ``torch.tensor(0.0)``)."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    params = group.get("params", [])
    on_cpu = not params or params[0].device.type == "cpu"
    return on_cpu or bool(group.get("fused")) or bool(group.get("capturable"))
