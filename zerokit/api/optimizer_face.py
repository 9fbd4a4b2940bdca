"""A ``torch.optim.Optimizer`` face over optimizers zerokit builds on its shards, so torch's LR schedulers drive them.

torch's schedulers (``StepLR``, ``LambdaLR``, ``OneCycleLR``…) accept only an instance of
``torch.optim.Optimizer`` and work through two things: ``param_groups`` (they write each
group's ``lr``, and set ``initial_lr``) and ``step`` (they wrap it, to warn when the
scheduler steps first). A ZeRO rank steps torch optimizers built on the fp32 masters of its
shards, and a step is more than the inner optimizer's (reduce, step, gather). Lifecycle of
an :class:`OptimizerFace`:

1. made by its owner (:class:`~.engine.Engine` for ``engine.optimizer``;
   :class:`~.sharded_optimizer.ShardedOptimizer` is one) over the inner optimizers;
   ``Optimizer.__init__`` is not run: the groups already exist;
2. ``param_groups`` are the inner optimizers' own group dicts, so a scheduler's ``lr``
   reaches the next inner step; ``state`` is theirs; ``defaults`` the first's;
3. ``step()`` and ``zero_grad()`` are the owner's — the engine's whole ZeRO step, at its
   accumulation boundary, as DeepSpeed's ``engine.optimizer.step()`` is.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, List

import torch

#: the hook tables torch's Optimizer methods read; Optimizer.__init__ would make them
_HOOK_TABLES = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
                "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
                "_optimizer_load_state_dict_post_hooks")


class OptimizerFace(torch.optim.Optimizer):
    """``param_groups``, ``state`` and ``defaults`` of inner torch optimizers, under one Optimizer."""

    def __init__(self, inner: Callable[[], List[torch.optim.Optimizer]]):
        self._inner = inner
        for table in _HOOK_TABLES:
            setattr(self, table, OrderedDict())
        first = inner()
        self.defaults = dict(first[0].defaults) if first else {}

    @property
    def param_groups(self) -> List[dict]:
        return [group for optimizer in self._inner() for group in optimizer.param_groups]

    @property
    def state(self):
        merged: dict = {}
        for optimizer in self._inner():
            merged.update(optimizer.state)
        return merged

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(type(o).__name__ for o in self._inner())})"


class EngineOptimizer(OptimizerFace):
    """``engine.optimizer``: the engine's optimizer as torch sees one; ``step`` is the engine's step."""

    def __init__(self, engine, inner: torch.optim.Optimizer):
        super().__init__(lambda: [inner])
        self._engine = engine

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("engine.optimizer.step(closure=…) is not supported: call engine.backward(loss) first")
        self._engine._step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._engine.zero_grad()

    def state_dict(self):
        raise TypeError("engine.optimizer.state_dict(): the states are sharded over the ranks; save them with "
                        "zerokit.checkpoint.save(directory, engine) (any layout can load it)")

    def load_state_dict(self, state_dict) -> None:
        raise TypeError("engine.optimizer.load_state_dict(): load with zerokit.checkpoint.load(directory, engine)")

    def add_param_group(self, param_group: dict) -> None:
        raise ValueError("engine.optimizer.add_param_group(): the engine's shards are laid out at zerokit.initialize; "
                         "give every parameter to initialize")
