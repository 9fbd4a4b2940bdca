"""``launch`` under torchrun: the ranks already exist, so ``fn`` runs in this process as its rank.

Lifecycle: ``zerokit.launch`` sees it runs under torchrun (:func:`under_torchrun`) and
calls :func:`launch_under_torchrun` instead of starting processes. The first call joins the
process group — through torchrun's store (``init_method="env://"``), or, where the agent
shares its own store with the workers (the c10d rendezvous), through a store of this round's
own (:func:`_round_store`: a restart must not read the previous attempt's keys) — and keeps
it for later calls (joining again after leaving is not reliable); an ``atexit`` hook leaves
it when the interpreter exits. Each call runs ``fn(ctx)`` here, then gathers every
rank's result with ``all_gather_object``, so every rank gets the list by rank, as
from a spawned launch, and destroys the process groups the call's meshes made
(:func:`.mesh.destroy_groups_made_since`: each call builds its meshes anew, and the world
group outlives it). Failures propagate as ordinary exceptions, the groups left as they
are (a peer may be gone mid-collective): torchrun itself watches the ranks.

Nodes (:mod:`.nodes`): torchrun starts ``LOCAL_WORLD_SIZE`` workers on each node, node
``GROUP_RANK`` holding global ranks ``GROUP_RANK·LOCAL_WORLD_SIZE`` onward. A lost node ends
cleanly (:mod:`.node_loss`): its workers die with their agent, and the ranks left raise
:class:`.nodes.NodeLost` naming it, written where the agent reads a worker's failure — on gloo;
on NCCL torch's watchdog tears the ranks down first, and zerokit says so instead.
"""
from __future__ import annotations

import atexit
import datetime
import os
import time
import uuid

import torch
import torch.distributed as dist

from .context import RankContext, set_current
from .mesh import destroy_groups_made_since, groups_made
from .node_loss import (add_nccl_note, close_answering_socket, die_with_agent, lost_ranks_error, mark_stopped,
                        open_answering_socket, record_for_agent, say_nccl_note)

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
        die_with_agent()
        timeout = datetime.timedelta(seconds=timeout_s)
        bound = {"device_id": device if device.type == "cuda" else None}  # NCCL: bound to its GPU
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # a store of this round's own (docstring)
            dist.init_process_group(backend, store=_round_store(rank, timeout), rank=rank, world_size=world_size,
                                    timeout=timeout, **bound)
        else:
            dist.init_process_group(backend, init_method="env://", timeout=timeout, **bound)
        atexit.register(_leave_group)
        open_answering_socket(rank, world_size, _agent_store, _round_id)
        say_nccl_note(backend, rank)
    ctx = RankContext(rank, world_size, device, backend, torchrun=True)
    set_current(ctx)
    mark = groups_made()
    try:
        value = fn(ctx, *args, **kwargs)
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, value)
    except Exception as exc:
        mark_stopped(rank, exc)
        lost = lost_ranks_error(exc, rank, world_size)
        if lost is None:
            add_nccl_note(exc, backend)
            raise
        lost.__cause__ = exc
        record_for_agent(lost)
        raise lost from exc
    finally:
        set_current(None)
    destroy_groups_made_since(mark)  # every rank is past fn (the gather): the call's meshes' groups are idle
    return gathered


# --- a store for each rendezvous round ----------------------------------------------------

#: the key of the agent's store under which each round's rank 0 publishes "PORT ROUND-ID" of its round's store
ROUND_STORE_KEY = "zerokit/round-store"
#: the key of each round's own store that holds its round id: a rank checks it after connecting
ROUND_ID_KEY = "zerokit/round-id"
#: the agent's store (a client; hosted by node 0's agent, it outlives the workers) and this round's id
_agent_store = None
_round_id = ""


def _round_store(rank: int, timeout: datetime.timedelta):
    """The store this round's ranks join through: hosted by rank 0, found by the others through the agent's.

    torchrun's c10d rendezvous hands every restart the same agent-hosted store (since the agent shares
    it, pytorch/pytorch#128096: ``TORCHELASTIC_USE_AGENT_STORE=True``; torch 2.13 here), while
    ``init_process_group`` adds no per-attempt prefix
    (``TORCHELASTIC_RESTART_COUNT`` is not one: a node restarted for another's failure keeps its
    count): the ranks of a restart read the previous attempt's keys — gloo's addresses of processes
    now dead — and fail with "Connection refused" (pytorch/pytorch#135712). Here rank 0 serves a new
    store on a free port, writes the round's id in it under :data:`ROUND_ID_KEY`, and then publishes
    "port id" under :data:`ROUND_STORE_KEY`. Another rank may read the previous round's entry there,
    until this round's rank 0 has replaced it: its port belonged to a rank 0 that has exited (torchrun
    stops a round's workers before the next round's start), so nothing answers there, or a store
    answers that another program — or this round's rank 0 — took the port for. So a rank takes the
    store only once one answers at the published port and holds the published round id; otherwise it
    reads the entry again.
    """
    global _agent_store, _round_id
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    _agent_store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    if rank == 0:
        own = dist.TCPStore(host, 0, is_master=True, timeout=timeout, wait_for_workers=False)
        _round_id = uuid.uuid4().hex
        own.set(ROUND_ID_KEY, _round_id)  # before publishing: whoever reads the entry finds the id there
        _agent_store.set(ROUND_STORE_KEY, f"{own.port} {_round_id}")
        return own
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        published, round_id = _agent_store.get(ROUND_STORE_KEY).decode().split()
        try:
            own = dist.TCPStore(host, int(published), is_master=False, timeout=datetime.timedelta(seconds=1))
        except (RuntimeError, ValueError):  # nothing answers: a previous round's; this round's comes
            why = "no store answers there"
        else:
            if _holds_round(own, round_id):
                _round_id = round_id
                own.set_timeout(timeout)
                return own
            why = f"the store there does not hold round {round_id} (a previous round's entry, its port taken again)"
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank 0 published the port {published} in the agent's store ({host}:{port}) but "
                               f"{why} after {timeout.total_seconds():g} s")
        time.sleep(0.05)


def _holds_round(store, round_id: str) -> bool:
    """Whether ``store`` is round ``round_id``'s own (its :data:`ROUND_ID_KEY` says so); without waiting."""
    try:
        return store.check([ROUND_ID_KEY]) and store.get(ROUND_ID_KEY).decode() == round_id
    except (RuntimeError, ValueError):  # not a store that answers as torch's does
        return False


def _leave_group() -> None:
    close_answering_socket()
    if dist.is_initialized():
        dist.destroy_process_group()
