"""``zerokit.ShardedOptimizer``: ZeRO-1 over any torch optimizer, torch's ``ZeroRedundancyOptimizer`` interface.

``ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)`` gives each rank the
optimizer states of 1/N of the parameters. It is zerokit's ``zero1`` strategy
(:mod:`zerokit.zero.stage1`) on the parameters it is given, one per parameter group:

1. construction: rank 0's parameters are broadcast over the data-parallel group (so
   every rank starts equal), the parameters are laid out in flat units padded to a
   multiple of N, and the given optimizer class is built on this rank's fp32 shards;
2. ``loss.backward()``: the gradients accumulate into the flat buffers and each unit is
   reduce-scattered to its owner as it fills (alone, ZeRO-1 reduces the gradients itself:
   ZeRO's reduce-scatter + all-gather, the bytes of DDP's all-reduce). Over the parameters
   of a ``zerokit.DistributedDataParallel`` it reduces nothing — the wrapper averaged them,
   as torch's ZeroRedundancyOptimizer leaves the reduction to DDP — and steps the averaged
   gradients as they are; the same over the parameters of a torch
   ``DistributedDataParallel`` (found among the live torch DDP modules at construction);
3. ``step()``: each rank steps its shards, then all-gathers the updated parameters;
   ``zero_grad()`` zeroes the flat gradient buffers;
4. ``consolidate_state_dict(to=0)`` gathers every shard's optimizer states, and
   ``state_dict()`` on that rank returns them per parameter, in torch's layout.

It is a ``torch.optim.Optimizer`` (:mod:`.optimizer_face`): ``param_groups`` are the inner
optimizers' groups, one per given group with its own hyperparameters, so torch's LR
schedulers drive it; ``add_param_group`` adds one (on every rank). Frozen parameters
(``requires_grad=False``) are accepted, as torch's optimizers accept them: broadcast from
the first rank at construction, so the replicas agree, and never stepped.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional

import torch
import torch.nn as nn

from ..checkpoint.layout import group_of, place_state
from ..optim import OptimizerSpec
from ..parallelize import parallelize
from ..runtime import comm
from ..runtime.wrapping import broadcast_from_first, rank_context
from ..strategies.base import TrainConfig
from ..zero.stage1 import ZeroStage1
from .ddp import precision_of
from .optimizer_face import OptimizerFace


class _Holder(nn.Module):
    """The given parameters as a module, so the ZeRO-1 strategy can lay them out (names ``p0``, ``p1``, …)."""

    def __init__(self, params: List[nn.Parameter]):
        super().__init__()
        for i, p in enumerate(params):
            self.register_parameter(f"p{i}", p)


def _in_torch_ddp() -> set:
    """ids of the parameters of every live torch ``DistributedDataParallel`` (torch's reducer keeps no mark on a
    parameter, so the modules are looked up among the objects the garbage collector tracks). Each object's type is
    asked, never the object: ``isinstance`` reads ``obj.__class__``, which for torch's deprecated
    ``torch.distributed.reduce_op`` warns (a FutureWarning on every walk)."""
    import gc

    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    return {id(p) for obj in gc.get_objects() if issubclass(type(obj), TorchDDP) for p in obj.module.parameters()}


def _groups(params) -> List[dict]:
    params = list(params)
    if not params:
        raise ValueError("ShardedOptimizer(params=…): got no parameters")
    if isinstance(params[0], dict):
        return [dict(g, params=list(g["params"])) for g in params]
    return [{"params": params}]


class ShardedOptimizer(OptimizerFace):
    """ZeRO-1 over ``optimizer_class``; see the module docstring."""

    def __init__(self, params: Iterable, optimizer_class: type = torch.optim.AdamW, **defaults):
        self.ctx = rank_context("zerokit.ShardedOptimizer")
        self.optimizer_class, self._given_defaults = optimizer_class, defaults
        self.param_groups_given: List[dict] = []
        self.order: List[nn.Parameter] = []
        #: per given group, the ZeRO-1 strategy stepping its trainable parameters (None: every one is frozen)
        self.group_strategies: List = []
        #: the strategies whose gradients a data-parallel wrapper already averaged (zerokit.DistributedDataParallel)
        self._reduced_by_wrapper: set = set()
        self._consolidated: Optional[dict] = None
        for group in _groups(params):
            self.add_param_group(group)
        super().__init__(lambda: [s.optimizer.optimizer for s in self.strategies])
        self.defaults = {**self.defaults, **defaults}

    @property
    def strategies(self) -> list:
        return [s for s in self.group_strategies if s is not None]

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (a collective: every rank adds the same), as torch's optimizers and ZeroRedundancyOptimizer do:
        its trainable parameters get their own ZeRO-1 layout and inner optimizer with the group's hyperparameters;
        frozen ones are broadcast from the group's first rank, so the replicas agree, and never stepped."""
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise ValueError("ShardedOptimizer.add_param_group(param_group=…) needs a dict with 'params'")
        group = dict(param_group, params=[param_group["params"]] if isinstance(param_group["params"], torch.Tensor)
                     else list(param_group["params"]))
        known = {id(p) for p in self.order}
        if any(id(p) in known for p in group["params"]):
            raise ValueError("ShardedOptimizer: some parameters appear in more than one parameter group")
        self.param_groups_given.append(group)
        self.order += group["params"]
        frozen = [p for p in group["params"] if not p.requires_grad]
        if frozen:
            broadcast_from_first(_Holder(frozen), self.ctx)
        trained = [p for p in group["params"] if p.requires_grad]
        strategy = None
        if trained:
            in_torch_ddp = _in_torch_ddp()
            reduced = {getattr(p, "_zerokit_reduced_by", "") or ("torch's DistributedDataParallel" if id(p) in
                                                                 in_torch_ddp else "") for p in trained}
            if len(reduced) > 1:
                raise ValueError(f"ShardedOptimizer: a param group mixes parameters a data-parallel wrapper reduces "
                                 f"({sorted(r for r in reduced if r)}) with others; wrap the whole model once")
            holder = _Holder(trained)
            broadcast_from_first(holder, self.ctx)
            spec = OptimizerSpec.of_class(self.optimizer_class, **{**self._given_defaults, **{
                k: v for k, v in group.items() if k != "params"}})
            strategy = parallelize(holder, self.ctx, strategy=ZeroStage1,
                                   config=TrainConfig(precision_of(holder), spec)).strategy
            if reduced != {""}:  # the wrapper averages the gradients: step them as they are, as ZeroRedundancyOptimizer
                for hook in strategy._hooks:
                    hook.remove()
                for p in trained:
                    p.grad = None
                self._reduced_by_wrapper.add(id(strategy))
            else:  # zerokit.pipeline's step holds its reduction to the last micro-batch (no_sync, then finish)
                for p in trained:
                    p._zerokit_zero1 = strategy
        self.group_strategies.append(strategy)

    def step(self, closure=None) -> None:
        if closure is not None:
            raise ValueError("ShardedOptimizer.step(closure=…) is not supported: compute the loss and call "
                             "backward before step()")
        with comm.phase("step"):
            for strategy in self.strategies:
                if id(strategy) in self._reduced_by_wrapper:  # averaged already: into the flat buffer as they are
                    with torch.no_grad():
                        for p, view in strategy.grad_views.items():
                            view.copy_(p.grad) if p.grad is not None else view.zero_()
                strategy.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for strategy in self.strategies:
            if id(strategy) in self._reduced_by_wrapper:  # the wrapper owns p.grad: torch's zero_grad
                for p in strategy.params:
                    p.grad = None
            else:
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
        for given, strategy in zip(self.param_groups_given, self.group_strategies):
            n = len(given["params"])
            hyper = strategy.optimizer.optimizer.param_groups[0] if strategy is not None else {
                **self.defaults, **given}
            groups.append({**{k: v for k, v in hyper.items() if k != "params"}, "params": list(range(start, start + n))})
            start += n
        return {"state": self._consolidated, "param_groups": groups}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Load a :meth:`state_dict` (the consolidated one, given on every rank, as ZeroRedundancyOptimizer takes it):
        each rank keeps its shard of each state and each group's hyperparameters."""
        if not isinstance(state_dict, dict) or {"state", "param_groups"} - set(state_dict):
            raise ValueError("ShardedOptimizer.load_state_dict(state_dict=…) needs {'state': …, 'param_groups': …}, "
                             "from state_dict() after consolidate_state_dict()")
        if len(state_dict["param_groups"]) != len(self.param_groups_given):
            raise ValueError(f"ShardedOptimizer.load_state_dict: {len(state_dict['param_groups'])} param groups saved, "
                             f"{len(self.param_groups_given)} here")
        states = state_dict["state"]
        index = {id(p): i for i, p in enumerate(self.order)}
        for saved, strategy in zip(state_dict["param_groups"], self.group_strategies):
            if strategy is None:
                continue
            inner = strategy.optimizer
            inner.optimizer.param_groups[0].update({k: v for k, v in saved.items() if k != "params"})
            n, me = strategy.world, strategy.rank  # the dp group's size and this rank's place in it
            for unit, master in zip(strategy.units, inner.masters):
                first = states.get(index[id(unit.params[0])], {})
                group = group_of(inner.optimizer, master)
                restored = {}
                for key, value in first.items():
                    if not torch.is_tensor(value) or value.dim() == 0:  # step: where torch's load_state_dict puts it
                        restored[key] = place_state(master, key, value.clone(), group) if torch.is_tensor(value) \
                            else value
                        continue
                    full = torch.zeros(unit.padded_numel, dtype=value.dtype, device=master.device)
                    for p, view in zip(unit.params, unit.views(full)):
                        view.copy_(states[index[id(p)]][key].reshape(view.shape))
                    restored[key] = place_state(master, key, full.view(n, -1)[me].clone(), group)
                inner.optimizer.state[master] = restored
