"""What a rank knows about itself: rank, world size, device, and its place on the device mesh.

``zerokit.launch`` (or torchrun) sets the context before the user's function runs;
library code reads it with :func:`current`. The launcher also installs a *status
slot*, a small piece of shared memory the parent reads when a rank hangs, and
:func:`note_collective` writes the collective a rank is entering into it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch


@dataclass
class RankContext:
    rank: int
    world_size: int
    device: torch.device
    backend: str
    #: launched by torchrun (in-process) rather than by zerokit.launch
    torchrun: bool = False
    _mesh: Optional[object] = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def mesh(self):
        """This rank's :class:`~zerokit.runtime.mesh.Mesh`; every rank on ``dp`` unless :meth:`set_mesh` said otherwise."""
        if self._mesh is None:
            self.set_mesh(None)
        return self._mesh

    def set_mesh(self, parallel) -> None:
        """Build the mesh for ``parallel`` (``{"dp": …, "tp": …, "pp": …}``; None: all ranks on ``dp``).
        Every rank must call it with the same degrees: it creates process groups."""
        from .mesh import Mesh

        self._mesh = Mesh.build(self.rank, self.world_size, self.device.type, parallel)


_current: Optional[RankContext] = None
_status_writer: Optional[Callable[[str], None]] = None


def current() -> RankContext:
    """The context of the rank this code runs in; outside a launch, a world of one on the CPU."""
    if _current is not None:
        return _current
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return RankContext(dist.get_rank(), dist.get_world_size(), torch.device("cpu"),
                           dist.get_backend())
    return RankContext(0, 1, torch.device("cpu"), "none")


def set_current(ctx: Optional[RankContext]) -> None:
    global _current
    _current = ctx


def set_status_writer(writer: Optional[Callable[[str], None]]) -> None:
    global _status_writer
    _status_writer = writer


def note_collective(description: str) -> None:
    """Record the collective this rank is entering, so a hang can be reported with it."""
    if _status_writer is not None:
        _status_writer(description)
