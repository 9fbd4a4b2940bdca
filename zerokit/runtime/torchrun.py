"""``launch`` under torchrun: the ranks already exist, so ``fn`` runs in this process as its rank.

Lifecycle: ``zerokit.launch`` sees it runs under torchrun (:func:`under_torchrun`) and
calls :func:`launch_under_torchrun` instead of starting processes. The first call joins the
process group through torchrun's store (``init_method="env://"``) and keeps it for
later calls (joining again after leaving is not reliable); an ``atexit`` hook leaves
it when the interpreter exits. Each call runs ``fn(ctx)`` here, then gathers every
rank's result with ``all_gather_object``, so every rank gets the list by rank, as
from a spawned launch. Failures propagate as ordinary exceptions: torchrun itself
watches the ranks.
"""
from __future__ import annotations

import atexit
import datetime
import os

import torch
import torch.distributed as dist

from .context import RankContext, set_current

BACKENDS = ("gloo", "nccl")


def check_backend(backend) -> None:
    """Refuse a backend zerokit does not run on (None: the launcher chooses)."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; allowed: None (choose), {', '.join(map(repr, BACKENDS))}")


#: what torchrun's agent (torch.distributed.elastic's LocalElasticAgent; so in torch 2.4 to 2.13) sets
#: in every worker's environment; SLURM, MPI or a user's own script may set RANK, WORLD_SIZE
#: (even LOCAL_RANK) too, but TORCHELASTIC_RUN_ID and GROUP_RANK are torchrun's own
TORCHRUN_VARIABLES = ("TORCHELASTIC_RUN_ID", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE")


def under_torchrun() -> bool:
    """Whether this process is a worker that torchrun (torch's elastic agent) started.

    A bare ``RANK``/``WORLD_SIZE`` is not enough: schedulers and other launchers set
    them too (and zerokit's DeepSpeed peer sets them inside a rank), and ``launch``
    must then still start its own ranks.
    """
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def rank_device(backend=None):
    """(backend, device) of this torchrun worker: the group's backend once joined, else ``backend`` or NCCL when
    this node has a GPU per local worker (``LOCAL_WORLD_SIZE``, not the whole world: the other nodes' GPUs
    are theirs); the device is this worker's own GPU, ``cuda:LOCAL_RANK``, on NCCL, else the CPU."""
    if dist.is_available() and dist.is_initialized():
        backend = str(dist.get_backend())
    elif backend is None:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
        backend = "nccl" if torch.cuda.device_count() >= local_world else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    return backend, torch.device("cuda", local_rank) if "nccl" in backend else torch.device("cpu")


def launch_under_torchrun(fn, world_size, args, kwargs, backend, timeout_s) -> list:
    """torchrun already started the ranks: run ``fn`` here as this one and gather all results.

    The first call joins the process group and keeps it for later calls (joining again
    through torchrun's store after leaving is not reliable); it is left at exit.
    """
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        raise ValueError(f"world_size={world_size!r} but torchrun started WORLD_SIZE={env_world} ranks; "
                         f"pass world_size={env_world}")
    check_backend(backend)
    rank = int(os.environ["RANK"])
    joined = dist.is_initialized()
    backend, device = rank_device(backend)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not joined:
        dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)  # NCCL: bound to its GPU
        atexit.register(_leave_group)
    ctx = RankContext(rank, world_size, device, backend, torchrun=True)
    set_current(ctx)
    try:
        value = fn(ctx, *args, **kwargs)
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, value)
    finally:
        set_current(None)
    return gathered


def _leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
