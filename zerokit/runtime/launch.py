"""``launch``: run a function on N ranks of a process group, from a script or a notebook cell.

Lifecycle of a call: validate the arguments before any process starts; under torchrun,
run ``fn`` in this process as torchrun's rank (:mod:`.torchrun`); otherwise pick a
backend (NCCL with one GPU per rank, else gloo on the CPU) and a start method (fork
where it is safe, else spawn with ``fn`` carried by cloudpickle, so functions and
classes defined in a cell still travel — FACTS §9), and hand over to the
:class:`.supervise.Supervisor`, which starts one process per rank (:mod:`.spawn`),
forwards their output line by line (:mod:`.output`), returns their results by rank or
raises :class:`.errors.RankFailed` / :class:`.errors.RankTimeout`, and kills and reaps
every rank on every exit path. The ranks join a process group that listens on the
loopback interface only.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
from typing import Any, Callable, Optional

import cloudpickle
import torch
import torch.distributed as dist

from .context import set_check_collectives
from .errors import RankFailed, RankTimeout
from .nodes import RANKS_PER_NODE_ENV
from .supervise import Supervisor
from .torchrun import BACKENDS, check_backend, launch_under_torchrun, under_torchrun

__all__ = ["launch", "RankFailed", "RankTimeout", "max_world_size"]

START_METHODS = ("fork", "spawn")


def max_world_size(backend: Optional[str] = None) -> int:
    """The most ranks ``launch`` accepts here: one CUDA device each for NCCL, a few per CPU core for gloo.

    ``backend=None`` is the limit of whichever backend ``launch`` would then pick.
    """
    check_backend(backend)
    gloo = max(8, 4 * (os.cpu_count() or 1))
    nccl = torch.cuda.device_count()
    return {"gloo": gloo, "nccl": nccl, None: max(gloo, nccl)}[backend]


def launch(fn: Callable[..., Any], world_size: int, *args, backend: Optional[str] = None,
           timeout_s: float = 300.0, threads_per_rank: int = 1, start_method: Optional[str] = None,
           heartbeat_s: Optional[float] = None, check_collectives: Optional[bool] = None,
           ranks_per_node: Optional[int] = None, **kwargs) -> list:
    """Run ``fn(ctx, *args, **kwargs)`` on ``world_size`` ranks and return their results by rank.

    ``ctx`` is the rank's :class:`~zerokit.context.RankContext`. ``backend`` None picks
    NCCL when there is a CUDA device per rank, else gloo. ``start_method`` None forks
    where that is safe (gloo on Linux, no process group or CUDA in this process), else
    spawns; NCCL always spawns (``start_method="fork"`` with NCCL is refused).
    Raises :class:`RankFailed` for the first rank that fails, :class:`RankTimeout` when
    the whole launch takes longer than ``timeout_s``; no rank outlives the call.
    ``heartbeat_s``: raise :class:`RankTimeout` as soon as no rank has entered, waited in
    or left a collective for that long (it must exceed the longest stretch of a rank's
    work between collectives). ``check_collectives``: before each collective, compare its
    op, element count and dtype across the group and fail fast on a mismatch (None: on
    when ``ZEROKIT_DEBUG_COLLECTIVES=1``). ``ranks_per_node``: emulate nodes of that many ranks on this
    machine (ranks 0…k−1 on node 0, and so on; it must divide ``world_size``): each rank's
    ``ZEROKIT_RANKS_PER_NODE`` says so, and the mesh's ``node`` axis and a two-tier link
    (``"nvlink/10gbe"``) follow it (:mod:`.nodes`); None: one node, unless the environment says otherwise.
    Under torchrun (its agent's TORCHELASTIC_RUN_ID, GROUP_RANK, LOCAL_RANK... set, not a
    mere RANK and WORLD_SIZE) ``fn`` runs here, as this process's rank.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r} must be a positive number of seconds")
    if isinstance(threads_per_rank, bool) or not isinstance(threads_per_rank, int) or threads_per_rank < 1:
        raise ValueError(f"threads_per_rank={threads_per_rank!r} must be an integer >= 1")
    if heartbeat_s is not None and (not isinstance(heartbeat_s, (int, float)) or isinstance(heartbeat_s, bool)
                                    or not heartbeat_s > 0):
        raise ValueError(f"heartbeat_s={heartbeat_s!r} must be None (off) or a positive number of seconds")
    if check_collectives is not None and not isinstance(check_collectives, bool):
        raise ValueError(f"check_collectives={check_collectives!r} must be True, False or None "
                         f"(None: as ZEROKIT_DEBUG_COLLECTIVES says)")
    check_ranks_per_node(ranks_per_node, world_size)
    if under_torchrun():
        local = int(os.environ["LOCAL_WORLD_SIZE"])
        if ranks_per_node is not None and ranks_per_node != local:
            raise ValueError(f"ranks_per_node={ranks_per_node} but torchrun started {local} ranks on each node "
                             f"(--nproc-per-node): under torchrun the nodes are real; leave ranks_per_node=None")
        if check_collectives is not None:  # fn runs in this process: its collectives read the flag here

            set_check_collectives(check_collectives)
        return launch_under_torchrun(fn, world_size, args, kwargs, backend, timeout_s)
    backend = choose_backend(backend, world_size)
    method = _choose_start_method(start_method, backend)
    if ranks_per_node is not None:  # every rank learns its emulated node size first thing
        args, fn_run = (fn, ranks_per_node, *args), _on_node
    else:
        fn_run = fn
    if method == "fork":
        _import_before_fork()
        job: Any = (fn_run, args, kwargs)  # inherited by the fork as it is: nothing is pickled
    else:
        try:
            job = cloudpickle.dumps((fn_run, args, kwargs))
        except Exception as exc:
            raise TypeError(f"start_method='spawn' sends fn and its arguments to the ranks with cloudpickle, "
                            f"which failed: {type(exc).__name__}: {exc}") from exc
    return Supervisor(mp.get_context(method), fn, job, world_size, backend, float(timeout_s), threads_per_rank,
                      None if heartbeat_s is None else float(heartbeat_s), check_collectives).run()


def check_ranks_per_node(ranks_per_node, world_size) -> None:
    """``ranks_per_node`` is None or a whole number of ranks dividing ``world_size`` (checked before any rank
    starts)."""
    if ranks_per_node is None:
        return
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise ValueError(f"ranks_per_node={ranks_per_node!r} must be None (one node) or a positive integer: the "
                         f"ranks on each emulated node")
    if isinstance(world_size, int) and not isinstance(world_size, bool) and world_size >= 1 \
            and world_size % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node} does not divide world_size={world_size}: nodes must "
                         f"hold equal numbers of ranks")


def _on_node(ctx, fn, ranks_per_node: int, *args, **kwargs):
    """Run ``fn`` as this rank of emulated nodes of ``ranks_per_node`` ranks (:mod:`.nodes` reads it)."""
    os.environ[RANKS_PER_NODE_ENV] = str(ranks_per_node)
    return fn(ctx, *args, **kwargs)


def _import_before_fork() -> None:
    """Import torch's compiler stack here, once, so that forked ranks inherit it.

    Building a torch optimizer imports ``torch._dynamo`` the first time (its
    ``disable`` decorator): about 2 s on 2 CPU cores, which every forked rank of every
    launch paid again when the calling process had never built one (measured: a 4-step
    job on 2 ranks 2.3 s per launch, 0.25 s after this import).
    """
    if "torch._dynamo" not in sys.modules:
        import torch._dynamo  # noqa: F401


def choose_backend(backend: Optional[str], world_size: int) -> str:
    """Validate ``backend`` and ``world_size`` together; None becomes NCCL when each rank gets a GPU.

    ``torch.cuda.device_count()`` asks NVML where it can, which, unlike
    ``torch.cuda.is_available()``, leaves CUDA uninitialised and fork safe.
    """
    check_backend(backend)
    if not dist.is_available():
        raise RuntimeError("this build of torch has no torch.distributed")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an integer from 1 to {max_world_size(backend)}")
    devices = torch.cuda.device_count()
    if backend == "nccl" and devices < world_size:
        raise ValueError(f"backend='nccl' needs one CUDA device per rank: world_size={world_size} but "
                         f"{devices} device(s) are visible; use backend='gloo' or fewer ranks")
    if backend is None:
        backend = "nccl" if devices >= world_size else "gloo"
    limit = max_world_size(backend)
    if world_size > limit:
        raise ValueError(f"world_size={world_size} is out of range for backend {backend!r} on this machine: "
                         f"allowed 1 to {limit}")
    return backend


def _fork_unsafe_reason(backend: Optional[str] = None) -> Optional[str]:
    if backend == "nccl":
        # torch.cuda.is_available() (called by most scripts, and by libraries at import) poisons fork without
        # setting torch.cuda.is_initialized(): a forked rank's first CUDA call then fails with "Cannot
        # re-initialize CUDA in forked subprocess". torch's own launchers never fork CUDA ranks either.
        return "NCCL ranks use CUDA, which a forked process cannot initialise once its parent has touched it"
    if not sys.platform.startswith("linux"):
        return "fork is used on Linux only"
    if dist.is_initialized():
        return "this process already holds a process group"
    if torch.cuda.is_initialized():
        return "this process has initialised CUDA"
    return None


def _choose_start_method(start_method: Optional[str], backend: Optional[str] = None) -> str:
    """``start_method`` checked, or chosen: fork where it is safe (gloo on Linux, no process group or CUDA in
    this process), else spawn — always spawn for NCCL."""
    if start_method is not None and start_method not in START_METHODS:
        raise ValueError(f"start_method={start_method!r}; allowed: None (choose), "
                         f"{', '.join(map(repr, START_METHODS))}")
    unsafe = _fork_unsafe_reason(backend)
    if start_method == "fork" and unsafe:
        raise ValueError(f"start_method='fork' is unsafe here: {unsafe}; use 'spawn' or None")
    return start_method or ("spawn" if unsafe else "fork")
