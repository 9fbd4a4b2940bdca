"""When a node is lost under torchrun: its workers die with their agent, and the ranks left name the node gone.

Lifecycle (driven by :func:`zerokit.runtime.torchrun.launch_under_torchrun`):

1. before joining, :func:`die_with_agent` asks Linux to SIGKILL this worker when the process
   that started it (its torchrun agent, PID 1 itself in a container without an init) dies
   (``PR_SET_PDEATHSIG``), as the spawn launcher's ranks die with theirs: a worker whose agent
   was killed could neither be restarted nor stopped by anyone, and would hold its peers in
   their collectives;
2. after joining, :func:`open_answering_socket` opens this rank's answering socket
   (listening on the address other machines reach its host at, :func:`_host_address`; never
   read: while the process lives the kernel answers a connection to it, once it has died the
   connection is refused) and the ranks exchange their addresses, with which machine each
   runs on and its process id; on NCCL, :func:`say_nccl_note` prints (rank 0) that a lost node
   is not named there (below);
3. when ``fn`` raises, :func:`mark_stopped` says so in the agent's store (a rank that stops on
   its own error is not counted lost), and :func:`lost_ranks_error` asks after every other
   rank until two rounds agree — a rank on this machine by its process (:func:`alive_here`),
   one on another machine by a knock on its socket (:func:`knock`): a gone rank's port on this
   machine may already serve another program (gloo's listener of another job, say), which a
   knock would disturb mid-handshake — if some no longer answer it returns a
   :class:`.nodes.NodeLost` naming them by node (``node 1 (ranks 2, 3) is gone``), which the
   caller chains to the torch error and :func:`record_for_agent` writes to the agent's error
   file (the agent's summary gives it as the root cause). The agent then ends the node's other
   workers; with ``--max-restarts`` it starts them again. When none is found lost on NCCL,
   :func:`add_nccl_note` adds the note to the error;
4. at exit, :func:`close_answering_socket`.

Gloo only: step 3 runs where the collective's failure reaches Python, as gloo's does. On NCCL,
torch's watchdog thread tears the process down when a collective fails or times out
(``TORCH_NCCL_ASYNC_ERROR_HANDLING``: torchrun sets 1, abort the communicator and tear down;
torch's default is 3, tear down), before Python sees an error; the agent's summary then gives the
watchdog's signal, not the node. zerokit says so (:data:`NCCL_NOTE`) rather than name the node there.
"""
from __future__ import annotations

import ctypes
import datetime
import errno
import ipaddress
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from typing import List, Optional, Sequence, Tuple

import torch.distributed as dist

from .nodes import NodeLost, describe_gone, node_of, ranks_per_node

_PR_SET_PDEATHSIG = 1


def die_with_agent() -> None:
    """Have Linux SIGKILL this worker when its torchrun agent (the process that started it) dies, however hard.

    Called before joining: a worker whose agent died while the request was being made (its parent then changed,
    to init or a subreaper) exits at once. The parent is compared before and after, not held to "is not PID 1":
    torchrun itself is PID 1 in a container started without an init (``docker run`` without ``--init``, a
    Kubernetes PyTorchJob, ``unshare -p -f``), and its workers are not orphans there. An agent that died before
    this call is not seen here (its worker was reparented already); the rendezvous then fails on its timeout."""
    if not sys.platform.startswith("linux"):
        return
    agent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != agent:  # the agent died before the request took effect: this worker is an orphan already
        os._exit(1)


#: this rank's answering socket (listening, never read) and every rank's (host, port), by rank
_answering: Optional[socket.socket] = None
_addresses: List[Tuple[str, int]] = []
#: every rank's (machine, process id, process start time), by rank
_processes: List[Tuple[str, int, str]] = []
#: the agent's store (where each rank says it stops on its own error) and this rendezvous round's id
_agent_store = None
_round_id = ""
#: how long a knock waits for an answer from another machine (a refused one on a live machine comes at once)
KNOCK_TIMEOUT_S = 3.0
#: how long the ranks left keep knocking until two knocks agree (the ranks of a lost node die a moment apart), or,
#: when every rank answers yet a collective failed, for a peer whose gloo connection closed before its socket did
SETTLE_S = 2.0


#: the variables that name the network interface gloo and NCCL use between machines, by backend
IFNAME_VARIABLES = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}
_SIOCGIFADDR = 0x8915  # Linux's ioctl for an interface's IPv4 address


def _interface_address(name: str) -> Optional[str]:
    """The IPv4 address of the network interface ``name``, None when it has none (or is not there)."""
    try:
        import fcntl
    except ImportError:  # not a Unix
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _named_interface(variable: str, value: str) -> Optional[str]:
    """The address of the first interface ``value`` names: ``GLOO_SOCKET_IFNAME``'s exact names, or
    ``NCCL_SOCKET_IFNAME``'s prefixes (``=eth0``: exactly); None for NCCL's exclusions (``^docker``), which name
    no interface to take, or where no interface named has an address."""
    exact = variable == IFNAME_VARIABLES["gloo"]
    if value.startswith("^"):
        return None
    if value.startswith("="):
        exact, value = True, value[1:]
    interfaces = [name for _, name in socket.if_nameindex()] if hasattr(socket, "if_nameindex") else []
    for wanted in filter(None, (v.strip() for v in value.split(","))):
        for name in ([wanted] if exact else [n for n in interfaces if n.startswith(wanted)]):
            address = _interface_address(name)
            if address is not None:
                return address
    return None


def _source_address(ip: str) -> str:
    """The address of the interface this machine reaches ``ip`` from (a UDP socket's connect sends nothing: the
    kernel only picks the route and its source address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((ip, 9))  # any port: nothing is sent
        return probe.getsockname()[0]


def _host_address(backend: Optional[str] = None) -> str:
    """The address the other ranks reach this host at.

    The interface ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` names (the backend's own first), as the backend
    itself uses it; else the interface that reaches ``MASTER_ADDR`` (the rendezvous host, which every node
    reaches), loopback only when ``MASTER_ADDR`` is loopback (every rank is on this machine). Not the hostname's
    address: Debian's /etc/hosts maps it to 127.0.1.1, where another machine's ranks would knock on their own
    loopback and call this host's live ranks gone. Without ``MASTER_ADDR``, or where it does not resolve or no
    route reaches it, the hostname's address."""
    variables = sorted(IFNAME_VARIABLES.values(), key=lambda v: v != IFNAME_VARIABLES.get(str(backend)))
    for variable in variables:
        value = os.environ.get(variable, "").strip()
        address = _named_interface(variable, value) if value else None
        if address is not None:
            return address
    master = os.environ.get("MASTER_ADDR", "").strip()
    if master:
        try:
            ip = socket.getaddrinfo(master, None, socket.AF_INET)[0][4][0]
            return "127.0.0.1" if ipaddress.ip_address(ip).is_loopback else _source_address(ip)
        except (OSError, IndexError):  # no IPv4 address for it, or no route to it
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return master or "127.0.0.1"


def open_answering_socket(rank: int, world_size: int, agent_store=None, round_id: str = "") -> None:
    """Open this rank's answering socket and learn every rank's (a collective: every rank joins); ``agent_store``
    and ``round_id``: where the ranks say they stop on their own error (None: nowhere)."""
    global _answering, _addresses, _processes, _agent_store, _round_id
    _agent_store, _round_id = agent_store, round_id
    host = _host_address(str(dist.get_backend()))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    except OSError:  # the hostname's address is not this machine's own: listen on every interface
        sock.bind(("", 0))
    sock.listen(socket.SOMAXCONN)  # connections are never accepted: the backlog takes the knocks
    sock.setblocking(False)
    _answering = sock
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, ((host, sock.getsockname()[1]), (machine(), os.getpid(), _started(os.getpid()))))
    _addresses = [tuple(a) for a, _ in gathered]
    _processes = [tuple(p) for _, p in gathered]


def machine() -> str:
    """Which machine (and process namespace) this is: the hostname, the kernel's boot id and the pid namespace —
    process ids compare only under one key ("" where /proc cannot say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{socket.gethostname()} {boot} {os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _started(pid: int) -> str:
    """A process's start time in clock ticks since boot (/proc/PID/stat's 22nd field), "" when it is gone; a zombie
    counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except OSError:
        return ""
    return "" if fields[0] in ("Z", "X") else fields[19]


def alive_here(pid: int, started: str) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs on this machine (not a later one that
    took its id)."""
    return bool(started) and _started(pid) == started


def _drain() -> None:
    """Accept and close the knocks waiting on this rank's socket, so that its backlog never fills."""
    while _answering is not None:
        try:
            conn, _ = _answering.accept()
        except OSError:  # none waiting (BlockingIOError), or the socket is closed
            return
        conn.close()


def knock(addresses: Sequence[Optional[Tuple[str, int]]], me: int, timeout_s: float = KNOCK_TIMEOUT_S) -> List[int]:
    """The ranks whose answering socket refuses a connection, or does not answer within ``timeout_s`` (an address
    None is skipped)."""
    _drain()
    gone, pending = [], {}
    selector = selectors.DefaultSelector()
    for rank, address in enumerate(addresses):
        if rank == me or address is None:  # None: asked after otherwise
            continue
        host, port = address
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


def _gone(me: int) -> List[int]:
    """The ranks gone: those on this machine by their process, the others by a knock on their socket."""
    here = machine()
    local = [r for r, (where, _, _) in enumerate(_processes) if here and where == here]
    gone = [r for r in local if r != me and not alive_here(*_processes[r][1:])]
    remote = [a if r not in local else None for r, a in enumerate(_addresses)]
    gone += [r for r in knock(remote, me) if remote[r] is not None]
    return sorted(gone)


def _stopped_key(rank: int) -> str:
    return f"zerokit/{_round_id}/stopped/{rank}"


def mark_stopped(rank: int, exc: BaseException) -> None:
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
    """Those of ``ranks`` that said they stop on an error (:func:`mark_stopped`)."""
    if _agent_store is None:
        return []
    try:
        return [r for r in ranks if _agent_store.check([_stopped_key(r)])]
    except Exception:  # noqa: BLE001 - the store is unreachable
        return []


def record_for_agent(error: BaseException) -> None:
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


#: what a rank on NCCL is told: a lost node is named on gloo only (the module docstring's "Gloo only")
NCCL_NOTE = ("zerokit names a lost node (NodeLost) on gloo only: on NCCL, torch's watchdog tears a rank down when a "
             "collective fails or times out (TORCH_NCCL_ASYNC_ERROR_HANDLING=1 under torchrun, 3 by default) before "
             "Python sees the error, and torchrun's summary gives the watchdog's signal, not the node")


def nccl_note(backend) -> Optional[str]:
    """:data:`NCCL_NOTE` where ``backend`` is NCCL; None on gloo, where a lost node is named."""
    return NCCL_NOTE if backend is not None and "nccl" in str(backend) else None


def say_nccl_note(backend, rank: int) -> None:
    """At joining, on rank 0 of an NCCL job: print :data:`NCCL_NOTE` to stderr, where torchrun's output is."""
    note = nccl_note(backend)
    if note is not None and rank == 0:
        print(f"zerokit: {note}", file=sys.stderr, flush=True)


def add_nccl_note(exc: BaseException, backend) -> None:
    """On NCCL, add :data:`NCCL_NOTE` to a communication error that reached Python with no rank found lost (the
    traceback prints it under the error; Python 3.11's ``add_note``, nothing on 3.10)."""
    note = nccl_note(backend)
    if note is not None and _from_communication(exc) and hasattr(exc, "add_note"):
        exc.add_note(note)


def lost_ranks_error(exc: BaseException, rank: int, world_size: int) -> Optional[NodeLost]:
    """A :class:`NodeLost` naming the ranks that no longer answer, or None when every rank does (``exc`` is then
    this rank's own error)."""
    if not _addresses or len(_addresses) != world_size:
        return None
    settle = time.monotonic() + SETTLE_S
    lost, seen = [], None
    while True:
        gone = _gone(rank)
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


def close_answering_socket() -> None:
    global _answering
    if _answering is not None:
        _answering.close()
        _answering = None
