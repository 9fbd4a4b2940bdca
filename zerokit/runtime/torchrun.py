"""``launch`` under torchrun: the ranks already exist, so ``fn`` runs in this process as its rank.

Lifecycle: ``zerokit.launch`` sees it runs under torchrun (:func:`under_torchrun`) and
calls :func:`launch_under_torchrun` instead of starting processes. The first call joins the
process group — through torchrun's store (``init_method="env://"``), or, where the agent
shares its own store with the workers (the c10d rendezvous), through a store of this round's
own (:func:`_round_store`: a restart must not read the previous attempt's keys) — and keeps
it for later calls (joining again after leaving is not reliable); an ``atexit`` hook leaves
it when the interpreter exits. Each call runs ``fn(ctx)`` here, then gathers every
rank's result with ``all_gather_object``, so every rank gets the list by rank, as
from a spawned launch. Failures propagate as ordinary exceptions: torchrun itself
watches the ranks.

Nodes (:mod:`.nodes`): torchrun starts ``LOCAL_WORLD_SIZE`` workers on each node, node
``GROUP_RANK`` holding global ranks ``GROUP_RANK·LOCAL_WORLD_SIZE`` onward. When a node is
lost, two things make it end cleanly:

- a worker dies with its agent: the first join asks Linux to SIGKILL this worker when the
  process that started it (its torchrun agent) dies (``PR_SET_PDEATHSIG``), as the spawn
  launcher's ranks die with theirs; a worker whose agent was killed could neither be
  restarted nor stopped by anyone, and would hold its peers in their collectives;
- the ranks left name what they lost: at the first join every rank opens an answering
  socket (listening on its host's address, never read: while the process lives the kernel
  answers a connection to it, once it has died the connection is refused) and the ranks
  exchange their addresses. When ``fn`` raises — a collective whose peer died fails with
  gloo's "Connection closed by peer", or times out — this rank knocks on every other rank's
  socket, and if some no longer answer it raises :class:`.nodes.NodeLost` naming them by
  node (``node 1 (ranks 2, 3) is gone``), chained to the torch error, and writes it to the
  agent's error file (the agent's summary gives it as the root cause). The agent then ends
  the node's other workers; with ``--max-restarts`` it starts them again, and
  ``zerokit.train(..., resume_from=save_dir)`` continues from the last checkpoint.
"""
from __future__ import annotations

import atexit
import ctypes
import datetime
import errno
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
import uuid
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .context import RankContext, set_current
from .nodes import NodeLost, describe_gone, node_of, ranks_per_node

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
        _open_answering_socket(rank, world_size)
    ctx = RankContext(rank, world_size, device, backend, torchrun=True)
    set_current(ctx)
    try:
        value = fn(ctx, *args, **kwargs)
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, value)
    except Exception as exc:
        _mark_stopped(rank, exc)
        lost = lost_ranks_error(exc, rank, world_size)
        if lost is None:
            raise
        lost.__cause__ = exc
        _record_for_agent(lost)
        raise lost from exc
    finally:
        set_current(None)
    return gathered


# --- a store for each rendezvous round ----------------------------------------------------

#: the key of the agent's store under which each round's rank 0 publishes "PORT ROUND-ID" of its round's store
ROUND_STORE_KEY = "zerokit/round-store"
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
    store on a free port and publishes the port under :data:`ROUND_STORE_KEY`; another rank takes
    the port once a store answers there: a port a previous round published belonged to a rank 0
    that has exited (torchrun stops a round's workers before the next round's start), so nothing
    answers it, or the port was taken again by this round's store.
    """
    global _agent_store, _round_id
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    _agent_store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    if rank == 0:
        own = dist.TCPStore(host, 0, is_master=True, timeout=timeout, wait_for_workers=False)
        _round_id = uuid.uuid4().hex
        _agent_store.set(ROUND_STORE_KEY, f"{own.port} {_round_id}")
        return own
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        published, _round_id = _agent_store.get(ROUND_STORE_KEY).decode().split()
        try:
            own = dist.TCPStore(host, int(published), is_master=False, timeout=datetime.timedelta(seconds=1))
        except (RuntimeError, ValueError) as exc:  # nothing answers: a previous round's; this round's comes
            if time.monotonic() > deadline:
                raise RuntimeError(f"no store answers at the port {published} that rank 0 published in the agent's "
                                   f"store ({host}:{port}) for {timeout.total_seconds():g} s") from exc
            time.sleep(0.05)
            continue
        own.set_timeout(timeout)
        return own


# --- a worker dies with its agent ---------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def die_with_agent() -> None:
    """Have Linux SIGKILL this worker when its torchrun agent (the process that started it) dies, however hard.

    Called before joining: a worker whose agent died first (its parent is then init) exits at once."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the agent died before the request took effect: this worker is an orphan already
        os._exit(1)


# --- the ranks left name the ranks gone ---------------------------------------------------

#: this rank's answering socket (listening, never read) and every rank's (host, port), by rank
_answering: Optional[socket.socket] = None
_addresses: List[Tuple[str, int]] = []
#: how long a knock waits for an answer from another machine (a refused one on a live machine comes at once)
KNOCK_TIMEOUT_S = 3.0
#: how long the ranks left keep knocking until two knocks agree (the ranks of a lost node die a moment apart), or,
#: when every rank answers yet a collective failed, for a peer whose gloo connection closed before its socket did
SETTLE_S = 2.0


def _host_address() -> str:
    """The address the other ranks reach this host at: its hostname's, as gloo's default device uses."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")


def _open_answering_socket(rank: int, world_size: int) -> None:
    """Open this rank's answering socket and learn every rank's (a collective: every rank joins)."""
    global _answering, _addresses
    host = _host_address()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    except OSError:  # the hostname's address is not this machine's own: listen on every interface
        sock.bind(("", 0))
    sock.listen(socket.SOMAXCONN)  # connections are never accepted: the backlog takes the knocks
    sock.setblocking(False)
    _answering = sock
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, (host, sock.getsockname()[1]))
    _addresses = [tuple(a) for a in gathered]


def _drain() -> None:
    """Accept and close the knocks waiting on this rank's socket, so that its backlog never fills."""
    while _answering is not None:
        try:
            conn, _ = _answering.accept()
        except OSError:  # none waiting (BlockingIOError), or the socket is closed
            return
        conn.close()


def knock(addresses: Sequence[Tuple[str, int]], me: int, timeout_s: float = KNOCK_TIMEOUT_S) -> List[int]:
    """The ranks whose answering socket refuses a connection, or does not answer within ``timeout_s``."""
    _drain()
    gone, pending = [], {}
    selector = selectors.DefaultSelector()
    for rank, (host, port) in enumerate(addresses):
        if rank == me:
            continue
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex((host, port))
        if code in (errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
            pending[sock] = rank
            selector.register(sock, selectors.EVENT_WRITE)
            continue
        sock.close()
        if code != 0:  # refused (the process is gone), or no route to its host
            gone.append(rank)
    deadline = time.monotonic() + timeout_s
    while pending and (left := deadline - time.monotonic()) > 0:
        for key, _ in selector.select(left):
            sock = key.fileobj
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                gone.append(pending[sock])
            selector.unregister(sock)
            sock.close()
            del pending[sock]
    for sock, rank in pending.items():  # no answer in time: its machine is down or unreachable
        gone.append(rank)
        sock.close()
    selector.close()
    return sorted(gone)


def _stopped_key(rank: int) -> str:
    return f"zerokit/{_round_id}/stopped/{rank}"


def _mark_stopped(rank: int, exc: BaseException) -> None:
    """Tell the other ranks, in the agent's store, that this rank stops on an error (so that it is not counted as
    lost when it has gone by the time they look). Best effort: the store may be gone with node 0."""
    if _agent_store is None:
        return
    try:
        _agent_store.set_timeout(datetime.timedelta(seconds=2))
        _agent_store.set(_stopped_key(rank), f"{type(exc).__name__}: {exc}"[:500])
    except Exception:  # noqa: BLE001 - the store is unreachable: the others count this rank as lost
        pass


def _stopped(ranks: Sequence[int]) -> List[int]:
    """Those of ``ranks`` that said they stop on an error (:func:`_mark_stopped`)."""
    if _agent_store is None:
        return []
    try:
        return [r for r in ranks if _agent_store.check([_stopped_key(r)])]
    except Exception:  # noqa: BLE001 - the store is unreachable
        return []


def _record_for_agent(error: BaseException) -> None:
    """Write ``error`` where torchrun's agent reads a worker's failure (``TORCHELASTIC_ERROR_FILE``): the agent's
    summary then gives it as the root cause. The first rank left to find the loss fails first; its agent then
    stops the node's other workers (SIGTERM) before they have said anything."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    text = "".join(traceback.format_exception(error))  # the torch error's stack, then this one's line
    data = {"message": {"message": f"{type(error).__name__}: {error}",  # torch's ErrorHandler.record_exception format
                        "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:  # the message is printed anyway; the summary is a convenience
        pass


def _from_communication(exc: BaseException) -> bool:
    """Whether ``exc`` is how torch reports a peer lost: a distributed error, or gloo's / NCCL's RuntimeError."""
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        word in text for word in ("connection", "closed by peer", "timed out", "timeout", "gloo", "nccl", "socket"))


def lost_ranks_error(exc: BaseException, rank: int, world_size: int) -> Optional[NodeLost]:
    """A :class:`NodeLost` naming the ranks that no longer answer, or None when every rank does (``exc`` is then
    this rank's own error)."""
    if not _addresses or len(_addresses) != world_size:
        return None
    settle = time.monotonic() + SETTLE_S
    lost, seen = [], None
    while True:
        gone = knock(_addresses, rank)
        stopped = _stopped(gone)
        lost = [r for r in gone if r not in stopped]
        if lost and lost == seen:  # two knocks agree: a node's ranks die a moment apart, all of them are counted
            break
        if (not lost and not _from_communication(exc)) or time.monotonic() >= settle:
            break
        seen = lost
        time.sleep(0.1)
    if not lost:
        return None
    per_node = ranks_per_node(world_size)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    also = (f" (stopped too, each on its own error: rank{'s' if len(stopped) > 1 else ''} "
            f"{', '.join(map(str, stopped))})" if stopped else "")
    return NodeLost(f"{describe_gone(lost, per_node)}: no answer from {'its rank' if len(lost) == 1 else 'them'} "
                    f"(a machine down, a torchrun agent killed, or ranks crashed). This rank ({rank}, node "
                    f"{node_of(rank, per_node)}) stopped at {type(exc).__name__}: {first}{also}", lost, per_node)


def _leave_group() -> None:
    global _answering
    if _answering is not None:
        _answering.close()
        _answering = None
    if dist.is_initialized():
        dist.destroy_process_group()
