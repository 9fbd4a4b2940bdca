"""ZeRO-3's persistent parameters (DeepSpeed's ``stage3_param_persistence_threshold``): kept whole, not sharded.

Lifecycle: :class:`~.stage3.ZeroStage3` puts every dense parameter smaller than the threshold
into one flat unit that is never freed (``persistent``), with ``persistent_master`` what the
optimizer steps. At the end of each micro-batch's backward :meth:`_reduce_persistent`
all-reduces their gradients (divided by N first) and adds them to the step's
``persistent_grad``; after each step :meth:`refresh_persistent` casts the stepped values back
into the compute copy when that is 16-bit.
"""
from __future__ import annotations

import torch

from ..runtime import comm


class PersistentParameters:
    """The all-reduce and the refresh of ZeRO-3's persistent parameters (mixed into :class:`~.stage3.ZeroStage3`)."""

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
        flat = flat.to(self.persistent_master.dtype)
        self.persistent_grad = flat if self.persistent_grad is None else self.persistent_grad.add_(flat)

    @torch.no_grad()
    def refresh_persistent(self) -> None:
        """Under a 16-bit compute dtype: the persistent parameters' compute copy, cast from what was stepped."""
        if self.persistent is not None and self.persistent_master is not self.persistent.data:
            self.persistent.data.copy_(self.persistent_master)
