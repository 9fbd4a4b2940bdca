"""DeepSpeed's ``scheduler`` block: ``WarmupLR`` and ``WarmupDecayLR``, as ``deepspeed.runtime.lr_schedules`` has them.

A DeepSpeed config's ``"scheduler": {"type": "WarmupLR", "params": {…}}`` makes
``initialize`` return a scheduler (its fourth value) that the engine steps after every
optimizer step, as DeepSpeed's engine does. Lifecycle of one:

1. made over ``engine.optimizer``: every group's ``lr`` is set to ``warmup_min_lr`` (DeepSpeed
   starts at iteration −1, where the rate is the minimum);
2. each ``step()`` (the engine calls it at every accumulation boundary) moves the iteration
   on and sets ``lr = min + (max − min)·γ``, with γ during the ``warmup_num_steps`` (at least
   2) ``log(i + 1) / log(warmup_num_steps)`` (``warmup_type="log"``, the default) or
   ``i / warmup_num_steps`` (``"linear"``), then 1; ``WarmupDecayLR`` then decays γ linearly
   to 0 at ``total_num_steps``: ``max(0, (total − i) / max(1, total − warmup))``.

Unknown parameters are refused by name; DeepSpeed's defaults fill the absent ones.
"""
from __future__ import annotations

import math

#: DeepSpeed's parameters and defaults (deepspeed/runtime/lr_schedules.py)
WARMUP_DEFAULTS = {"warmup_min_lr": 0.0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000, "warmup_type": "log"}
DECAY_DEFAULTS = {**WARMUP_DEFAULTS, "total_num_steps": None}


class WarmupLR:
    """DeepSpeed's WarmupLR (see the module docstring)."""

    defaults = WARMUP_DEFAULTS

    def __init__(self, optimizer, **params):
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise ValueError(f"scheduler {type(self).__name__}: parameters {unknown} are unknown; allowed: "
                             f"{', '.join(self.defaults)}")
        values = {**self.defaults, **params}
        if values["warmup_type"] not in ("log", "linear"):
            raise ValueError(f"scheduler warmup_type={values['warmup_type']!r}; allowed: 'log', 'linear'")
        self.optimizer = optimizer
        self.min_lr, self.max_lr = float(values["warmup_min_lr"]), float(values["warmup_max_lr"])
        self.warmup_num_steps = max(2, int(values["warmup_num_steps"]))
        self.warmup_type = values["warmup_type"]
        self.values = values
        self.last_batch_iteration = -1
        self._set(self.min_lr)

    def _gamma(self) -> float:
        i = self.last_batch_iteration
        if i < self.warmup_num_steps:
            if self.warmup_type == "log":
                return math.log(i + 1) / math.log(self.warmup_num_steps)
            return i / self.warmup_num_steps
        return 1.0

    def get_lr(self) -> float:
        if self.last_batch_iteration < 0:
            return self.min_lr
        return self.min_lr + (self.max_lr - self.min_lr) * self._gamma()

    def _set(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        self.last_batch_iteration += 1
        self._set(self.get_lr())

    def get_last_lr(self) -> list:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict) -> None:
        self.last_batch_iteration = state["last_batch_iteration"]
        self._set(self.get_lr())


class WarmupDecayLR(WarmupLR):
    """DeepSpeed's WarmupDecayLR: WarmupLR, then a linear decay to 0 at ``total_num_steps``."""

    defaults = DECAY_DEFAULTS

    def __init__(self, optimizer, **params):
        if params.get("total_num_steps") is None:
            raise ValueError("scheduler WarmupDecayLR needs total_num_steps")
        super().__init__(optimizer, **params)
        self.total_num_steps = int(self.values["total_num_steps"])
        if self.total_num_steps < self.warmup_num_steps:
            raise ValueError(f"scheduler WarmupDecayLR: total_num_steps={self.total_num_steps} is below "
                             f"warmup_num_steps={self.warmup_num_steps}")

    def _gamma(self) -> float:
        i = self.last_batch_iteration
        if i < self.warmup_num_steps:
            return super()._gamma()
        return max(0.0, (self.total_num_steps - i) / max(1.0, self.total_num_steps - self.warmup_num_steps))


SCHEDULERS = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR}


def scheduler_from_config(block, optimizer):
    """The scheduler a config's ``scheduler`` block names, over ``optimizer`` (None when there is no block)."""
    if block is None:
        return None
    if not isinstance(block, dict) or block.get("type") not in SCHEDULERS:
        raise ValueError(f"config scheduler={block!r}: type must be one of {', '.join(SCHEDULERS)} (DeepSpeed's "
                         f"OneCycle and LRRangeTest are not implemented); or drive engine.optimizer with a torch "
                         f"LR scheduler")
    extra = sorted(set(block) - {"type", "params"})
    if extra:
        raise ValueError(f"config scheduler: keys {extra} are unknown; allowed: type, params")
    return SCHEDULERS[block["type"]](optimizer, **dict(block.get("params", {})))
