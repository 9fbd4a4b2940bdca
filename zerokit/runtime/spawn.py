"""What runs in a rank process, from the moment it starts until it reports and exits.

Lifecycle, in the parent: :func:`rendezvous_socket` binds a free loopback port before
any rank starts; each rank gets a :class:`RankSpec` (rank, world, backend, port, ...),
and rank 0 also gets the listening socket itself. When the start method is spawn,
:func:`main_module_hidden` keeps the child from re-running the caller's script.

Lifecycle, in the child (:func:`rank_main`): first become the leader of a session and
process group of its own (:func:`own_session`), so that whatever the rank starts
(DataLoader workers, a subprocess) is in that group and the parent can kill it all
with ``os.killpg``; tie itself to the parent (:func:`die_with_parent`, so that Linux
kills it if the parent dies), ignore Ctrl-C (the
parent takes it), point fd 1 and 2 at the parent's pipes (:func:`redirect_output`),
arm faulthandler (a crash prints its stacks; SIGUSR1 prints them on a hang), install
the status slot the parent reads on a hang, join the process group through rank 0's
store on the pre-bound socket (:func:`init_process_group`), run ``fn``, send back
``("ok", value)`` or ``("error", ...)`` on the results pipe. A failure leaves with
``os._exit(1)``, skipping the group's teardown (peers may be gone or hung); success
destroys the group and returns.

The torch floor (pyproject: ``torch>=2.8``), raised rather than worked around: rank 0's
store serves on the parent's socket through ``TCPStore(master_listen_fd=...)``, and the
default (libuv) store server takes a listen fd only from torch 2.8 on
(pytorch/pytorch#150215); 2.4 to 2.7 raise ``NotImplementedError``. The legacy server
(``use_libuv=False``) would take the fd, but on those versions a rank's final
``destroy_process_group`` then deadlocks now and then: the gloo group's destructor joins
its worker thread while holding the GIL, which that thread needs to free a tensor the
rank's ``fn`` had used (gone in 2.8, presumably by pytorch/pytorch#154976, which releases
the GIL in that destructor).
Measured with the legacy-server fallback, three-rank launches hung in
``destroy_process_group`` 3 times in 8 on torch 2.4.1 and 7 in 12 on 2.7.1, never in 12
on 2.8.0, where tests/runtime/test_launcher.py passes whole.
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import faulthandler
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Optional

import cloudpickle
import torch
import torch.distributed as dist

from . import comm, context
from .context import RankContext, set_check_collectives, set_current, set_status_writer
from .hang import encode

LOOPBACK = "127.0.0.1"
#: size of the shared-memory slot holding the collective a rank is in (:mod:`.hang`'s format)
STATUS_BYTES = 320
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankSpec:
    rank: int
    world_size: int
    backend: str
    port: int
    group_timeout_s: float
    threads: int
    parent_pid: int
    #: compare each collective's signature across its group first (None: ZEROKIT_DEBUG_COLLECTIVES decides)
    check_collectives: bool | None = None


def rendezvous_socket() -> socket.socket:
    """A socket listening on a free loopback port, for rank 0's store to serve on.

    Holding it from before the ranks start means no other program can take the port
    in between, and the store listens on loopback only (with ``init_method="tcp://"``
    torch's store listens on every interface).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    sock.listen(128)
    return sock


def rank_main(spec: RankSpec, job, results, stdout, stderr, status, store_socket) -> None:
    """Entry point of a rank process: tie it to the parent, join the group, run fn, report back."""
    own_session()
    die_with_parent(spec.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent takes Ctrl-C and kills the ranks
    redirect_output(stdout, stderr)
    faulthandler.enable(file=sys.stderr, all_threads=True)  # a crash prints its stacks
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # so does a hang
    set_status_writer(_status_writer(status))
    set_check_collectives(spec.check_collectives)
    try:
        fn, args, kwargs = cloudpickle.loads(job) if isinstance(job, bytes) else job
        torch.set_num_threads(spec.threads)
        device = torch.device("cuda", spec.rank) if spec.backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        init_process_group(spec, store_socket, device)
        ctx = RankContext(spec.rank, spec.world_size, device, spec.backend)
        set_current(ctx)

        comm.ledger().reset()  # a forked rank starts with an empty ledger, not the parent's records and step
        value = fn(ctx, *args, **kwargs)
        try:
            message = cloudpickle.dumps(("ok", value))
        except Exception as exc:
            raise pickle.PicklingError(f"the return value of fn on rank {spec.rank} could not be pickled: "
                                       f"{type(exc).__name__}: {exc}") from None
        results.send_bytes(message)
    except BaseException as exc:  # SystemExit too: any way out of fn but returning is a failure
        report = ("error", time.time(), traceback.format_exc(), type(exc).__name__)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            results.send_bytes(cloudpickle.dumps(report))
        finally:
            os._exit(1)  # skip the group's teardown: peers may be gone or hung
    dist.destroy_process_group()


def own_session() -> None:
    """Make this rank the leader of a new session and process group, whose id is its pid.

    Its children inherit the group, so ``os.killpg(rank_pid, ...)`` reaches them too, even
    after the rank itself has exited. Called first thing, before the rank can start any
    process: until then the parent's plain kill of the rank is enough. (A descendant
    that starts a session of its own, e.g. ``start_new_session=True``, leaves the group.)
    """
    if hasattr(os, "setsid"):
        with contextlib.suppress(PermissionError):  # already a group leader: nothing to do
            os.setsid()


def die_with_parent(parent_pid: int, signum: int = signal.SIGKILL) -> None:
    """Have Linux send ``signum`` (SIGKILL: die on the spot) to this process when the parent dies, however hard,
    so none is orphaned; a process that must clean up first asks for a signal it handles."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def redirect_output(stdout, stderr) -> None:
    """Point fd 1 and 2 at the parent's pipes, so C-level output and Python's both reach it.

    Python's streams are rebuilt on the new fds, line-buffered: a forked child would
    otherwise keep the parent's (in Jupyter, the kernel's) stream objects.
    """
    for fd, pipe in ((1, stdout), (2, stderr)):
        os.dup2(pipe.fileno(), fd)
        pipe.close()
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)


def _status_writer(slot) -> Callable[[str], None]:
    def write(text: str) -> None:
        slot.value = text.encode("utf-8", "replace")[:STATUS_BYTES - 1]
    return write


def _status_writer_now() -> Callable[[str], None]:
    return context._status_writer or (lambda text: None)


def init_process_group(spec: RankSpec, store_socket: Optional[socket.socket], device: torch.device) -> None:
    """Join the group through rank 0's store on the parent's loopback socket; peers on loopback too. On a GPU the
    group is bound to the rank's device (``device_id``: NCCL sets its communicators up for that device at once)."""
    status_write = _status_writer_now()
    status_write(encode("init", 0, "", "", ""))
    if sys.platform.startswith("linux"):  # gloo and NCCL would otherwise listen on the hostname's address
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    timeout = datetime.timedelta(seconds=spec.group_timeout_s)
    serve = {"master_listen_fd": store_socket.detach()} if store_socket is not None else {}  # torch>=2.8
    store = dist.TCPStore(LOOPBACK, spec.port, spec.world_size, is_master=spec.rank == 0,
                          timeout=timeout, **serve)
    dist.init_process_group(spec.backend, store=store, rank=spec.rank, world_size=spec.world_size,
                            timeout=timeout, device_id=device if device.type == "cuda" else None)
    status_write(encode("idle", 0, "", "", ""))  # joined: a hang from here on is fn's


@contextlib.contextmanager
def main_module_hidden():
    """Keep a spawned rank from re-running the caller's script (or ``-m`` module) as ``__mp_main__``.

    multiprocessing does that so that pickles referring to ``__main__`` resolve; here
    cloudpickle carries ``fn`` and whatever it uses from ``__main__`` by value, and a
    script without an ``if __name__ == "__main__":`` guard would launch again in every
    rank. Fork children copy the parent instead, so hiding changes nothing for them.
    """
    with _MAIN_MODULE_LOCK:  # two launches from two threads must not restore each other's copy
        main = vars(sys.modules["__main__"])
        saved = {name: main[name] for name in ("__spec__", "__file__") if name in main}
        main["__spec__"] = None
        main.pop("__file__", None)
        try:
            yield
        finally:
            main.update(saved)


_MAIN_MODULE_LOCK = threading.Lock()
