"""What a rank knows about itself: rank, world size, device, and its place on the device mesh.

``zerokit.launch`` (or torchrun) sets the context before the user's function runs;
library code reads it with :func:`current`. The launcher also installs a *status
slot*, a small piece of shared memory the parent reads when a rank hangs or stalls:
:func:`enter_collective`, :func:`wait_collective` and :func:`leave_collective` write into
it the collective a rank is in (op, phase, call number, shape) and whether it is waiting
in it; :func:`note_collective` writes a free-form description. The slot's text format
is :mod:`.hang`'s. ``collectives_checked`` says whether each collective's signature is
compared across its group before it runs (``check_collectives`` / ``ZEROKIT_DEBUG_COLLECTIVES=1``).
"""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from . import clock
from .mesh import Mesh


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
    def mesh(self):
        """This rank's :class:`~zerokit.runtime.mesh.Mesh`; every rank on ``dp`` unless :meth:`set_mesh` said otherwise."""
        if self._mesh is None:
            self.set_mesh(None)
        return self._mesh

    def set_mesh(self, parallel) -> None:
        """Build the mesh for ``parallel`` (``{"dp": …, "tp": …, "pp": …}``; None: all ranks on ``dp``).
        Every rank must call it with the same degrees: it creates process groups."""
        self._mesh = Mesh.build(self.rank, self.world_size, self.device.type, parallel)


_current: Optional[RankContext] = None
#: (the user's default process group, weakly; its context): :func:`current` outside a launch, once per group
_adopted: Optional[tuple] = None
_status_writer: Optional[Callable[[str], None]] = None
_calls = 0  # collectives this rank has entered
_check_collectives: Optional[bool] = None  # None: ask ZEROKIT_DEBUG_COLLECTIVES


def current() -> RankContext:
    """The context of the rank this code runs in; outside a launch, a world of one on the CPU.

    In a process group the user made (a bare torchrun script) the context is built once per group and kept
    (:func:`_adopt`): every wrapper, engine and ``zerokit.measure`` of the loop shares its mesh and process
    groups, and times on its device's timeline."""
    if _current is not None:
        return _current
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # the user made the group (a bare torchrun script)
        return _adopt(dist.group.WORLD)
    return RankContext(0, 1, torch.device("cpu"), "none")


def _adopt(world) -> RankContext:
    """The context of the user's process group ``world``: built on first use, kept while that group lives (a new
    group after ``destroy_process_group`` gets a new one). Building it installs the device's clock (:mod:`.clock`:
    CUDA events on a GPU), as a launch does for its ranks."""
    global _adopted
    import torch.distributed as dist

    if world is not None and _adopted is not None and _adopted[0]() is world:
        ctx = _adopted[1]
        if ctx.device.type == "cuda" and not clock.on_device():  # a launch under torchrun ended: set_current(None)
            clock.use(ctx.device)
        return ctx
    backend = str(dist.get_backend())
    ctx = RankContext(dist.get_rank(), dist.get_world_size(), backend_device(backend), backend)
    if world is None:  # no group object to key on (a stand-in for torch.distributed): a context of its own each time
        return ctx
    _adopted = (weakref.ref(world), ctx)  # weakly, as the mesh holds its groups (destroy_process_group frees them)
    clock.use(ctx.device)
    return ctx


def backend_device(backend: str) -> torch.device:
    """The device a collective on ``backend`` carries its tensors on: this rank's current CUDA device for NCCL
    (which refuses host tensors), the CPU for gloo.

    Under torchrun the rank's GPU is ``LOCAL_RANK``, selected with ``torch.cuda.set_device`` before the first
    collective, as torch's own examples do; a rank that left the current device at 0 while ``LOCAL_RANK`` names
    another of the visible GPUs would share GPU 0 with rank 0, which NCCL refuses ("Duplicate GPU detected")
    or hangs on: that is refused here, with the call that fixes it.
    """
    if "nccl" not in backend:
        return torch.device("cpu")
    index = torch.cuda.current_device()
    local = os.environ.get("LOCAL_RANK")
    if local is not None and local.isdigit() and int(local) < torch.cuda.device_count() and int(local) != index:
        raise RuntimeError(f"this rank's current CUDA device is cuda:{index} but LOCAL_RANK={local}: call "
                           f"torch.cuda.set_device({local}) (or torch.cuda.set_device(int(os.environ['LOCAL_RANK'])))"
                           f" before init_process_group('nccl'), so that each rank uses its own GPU")
    return torch.device("cuda", index)


def set_current(ctx: Optional[RankContext]) -> None:
    """Make ``ctx`` this process's rank (None: none); times are measured on its device's timeline (:mod:`.clock`)."""
    global _current
    _current = ctx

    clock.use(ctx.device if ctx is not None else None)


def set_status_writer(writer: Optional[Callable[[str], None]]) -> None:
    """Install the slot's writer (a new rank): the call count starts again from zero."""
    global _status_writer, _calls
    _status_writer, _calls = writer, 0


def set_check_collectives(on: Optional[bool]) -> None:
    """Compare each collective's signature across its group before it runs (None: as the environment says)."""
    global _check_collectives
    _check_collectives = on


def collectives_checked() -> bool:
    if _check_collectives is not None:
        return _check_collectives
    return os.environ.get("ZEROKIT_DEBUG_COLLECTIVES", "") not in ("", "0")


#: between the fields of a rank's status line (read back by :mod:`.hang`)
STATUS_SEPARATOR = "\x1f"


def encode(state: str, call: int, op: str, phase: str, detail: str) -> str:
    """A rank's status as one line: what it is in (state), which call, op and phase, and a free-form detail."""
    return STATUS_SEPARATOR.join((state, str(call), op, phase, detail.replace(STATUS_SEPARATOR, " ")))


def _write(state: str, call: int, op: str = "", phase: str = "", detail: str = "") -> None:
    if _status_writer is not None:
        _status_writer(encode(state, call, op, phase, detail))


def note_collective(description: str) -> None:
    """Record a free-form description of what this rank is entering, so a hang can be reported with it."""
    _write("in" if description else "", _calls, "", "", description)


def enter_collective(op: str, phase: str, detail: str, async_op: bool = False) -> int:
    """Record that this rank enters (or, async, launches) a collective; returns its call number (from 1)."""
    global _calls
    _calls += 1
    _write("launched" if async_op else "in", _calls, op, phase, detail)
    return _calls


def wait_collective(call: int, op: str, phase: str, detail: str) -> None:
    """Record that this rank waits for async collective ``call`` to finish."""
    _write("wait", call, op, phase, detail)


def leave_collective(call: int, op: str, phase: str, detail: str) -> None:
    """Record that collective ``call`` returned (a rank stuck after it is not in a collective)."""
    _write("out", call, op, phase, detail)
