"""``zerokit.ShardedOptimizer``: ZeRO-1 over any torch optimizer, torch's ``ZeroRedundancyOptimizer`` interface.

``ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)`` gives each rank the
optimizer states of 1/N of the parameters. It is zerokit's ``zero1`` strategy
(:mod:`zerokit.zero.stage1`) on the parameters it is given, one per parameter group:

1. construction: rank 0's parameters are broadcast over the data-parallel group (so
   every rank starts equal), the parameters are laid out in flat units padded to a
   multiple of N, and the given optimizer class is built on this rank's fp32 shards;
2. ``loss.backward()``: the gradients accumulate into the flat buffers and each unit is
   reduce-scattered to its owner as it fills (ZeRO-1 reduces the gradients itself, so
   the model is *not* also wrapped in DDP — torch's ZeroRedundancyOptimizer leaves that
   to DDP's all-reduce; zerokit's is ZeRO's reduce-scatter + all-gather, the same bytes);
3. ``step()``: each rank steps its shards, then all-gathers the updated parameters;
   ``zero_grad()`` zeroes the flat gradient buffers;
4. ``consolidate_state_dict(to=0)`` gathers every shard's optimizer states, and
   ``state_dict()`` on that rank returns them per parameter, in torch's layout.

``param_groups`` are the inner optimizers' groups, so learning-rate schedulers work.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional

import torch
import torch.nn as nn

from ..runtime import comm
from .ddp import broadcast_from_first, precision_of
from .engine import rank_context


class _Holder(nn.Module):
    """The given parameters as a module, so the ZeRO-1 strategy can lay them out (names ``p0``, ``p1``, …)."""

    def __init__(self, params: List[nn.Parameter]):
        super().__init__()
        for i, p in enumerate(params):
            self.register_parameter(f"p{i}", p)


def _groups(params) -> List[dict]:
    params = list(params)
    if not params:
        raise ValueError("ShardedOptimizer(params=…): got no parameters")
    if isinstance(params[0], dict):
        return [dict(g, params=list(g["params"])) for g in params]
    return [{"params": params}]


class ShardedOptimizer:
    """ZeRO-1 over ``optimizer_class``; see the module docstring."""

    def __init__(self, params: Iterable, optimizer_class: type = torch.optim.AdamW, **defaults):
        from ..optim import OptimizerSpec
        from ..strategies.base import TrainConfig
        from ..zero.stage1 import ZeroStage1

        ctx = rank_context("zerokit.ShardedOptimizer")
        self.param_groups_given = _groups(params)
        self.order: List[nn.Parameter] = [p for g in self.param_groups_given for p in g["params"]]
        frozen = [i for i, p in enumerate(self.order) if not p.requires_grad]
        if frozen:
            raise ValueError(f"ShardedOptimizer(params=…): parameters {frozen[:5]} (by position) have "
                             f"requires_grad=False; give the optimizer only the parameters it steps")
        self.strategies = []
        for group in self.param_groups_given:
            holder = _Holder(group["params"])
            broadcast_from_first(holder, ctx)
            kwargs = {**defaults, **{k: v for k, v in group.items() if k != "params"}}
            spec = OptimizerSpec.of_class(optimizer_class, **kwargs)
            self.strategies.append(ZeroStage1(holder, ctx, TrainConfig(precision_of(holder), spec)))
        self._consolidated: Optional[dict] = None
        self.ctx = ctx

    @property
    def param_groups(self) -> List[dict]:
        return [g for s in self.strategies for g in s.optimizer.optimizer.param_groups]

    def step(self, closure=None) -> None:
        if closure is not None:
            raise ValueError("ShardedOptimizer.step(closure=…) is not supported: compute the loss and call "
                             "backward before step()")
        with comm.phase("step"):
            for strategy in self.strategies:
                strategy.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for strategy in self.strategies:
            strategy.zero_grad()

    def track_memory(self, ledger) -> None:
        for strategy in self.strategies:
            strategy.track_memory(ledger)

    # -- full optimizer states ----------------------------------------------------------
    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's shard of the optimizer states (a collective); rank ``to`` keeps them."""
        index = {id(p): i for i, p in enumerate(self.order)}
        state: Dict[int, dict] = {}
        with comm.phase("setup"):
            for strategy in self.strategies:
                inner = strategy.optimizer
                for unit, master in zip(strategy.units, inner.masters):
                    for key, value in inner.optimizer.state.get(master, {}).items():
                        if not torch.is_tensor(value) or value.dim() == 0:
                            for p in unit.params:
                                state.setdefault(index[id(p)], {})[key] = value.clone() if torch.is_tensor(value) \
                                    else value
                            continue
                        full = torch.empty(unit.padded_numel, dtype=value.dtype, device=value.device)
                        comm.all_gather(full, value.contiguous(), group=strategy.group, tag=f"consolidate {key}")
                        for p, view in zip(unit.params, unit.views(full)):
                            state.setdefault(index[id(p)], {})[key] = view.detach().cpu().clone()
        self._consolidated = state if self.ctx.rank == to else None
        self._to = to

    def state_dict(self) -> dict:
        """Torch's layout (``state`` by parameter position, ``param_groups``); after :meth:`consolidate_state_dict`,
        on the rank it named."""
        if self._consolidated is None:
            raise RuntimeError("ShardedOptimizer.state_dict(): call consolidate_state_dict(to=…) on every rank "
                               "first; the full states are then on that rank only")
        groups, start = [], 0
        for given, inner in zip(self.param_groups_given, self.param_groups):
            n = len(given["params"])
            groups.append({**{k: v for k, v in inner.items() if k != "params"}, "params": list(range(start, start + n))})
            start += n
        return {"state": self._consolidated, "param_groups": groups}
