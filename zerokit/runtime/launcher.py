"""``launch``: run a function on N ranks of a process group, from a script or a notebook cell.

The parent picks a backend (NCCL with one GPU per rank, else gloo on the CPU), starts
one process per rank (fork where it is safe, else spawn with ``fn`` carried by
cloudpickle, so functions and classes defined in a cell still travel — FACTS §9) and
joins them into a process group that listens on the loopback interface only. Each
rank's fd 1 and 2 are pipes the parent reads: it prints every whole line as
``[rN] ...`` from the calling thread, and nothing a rank wrote is lost when it dies.
Results come back by rank. The first rank to really fail raises :class:`RankFailed`
with its own traceback (ranks that failed only because a peer vanished are not
blamed); a hang raises :class:`RankTimeout` with the collective each hung rank last
entered. Every exit path kills and reaps every rank. Under ``torchrun`` the function
runs in-process as the torchrun rank instead.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import datetime
import faulthandler
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import cloudpickle
import torch
import torch.distributed as dist

from .context import RankContext, note_collective, set_current, set_status_writer

__all__ = ["launch", "RankFailed", "RankTimeout", "max_world_size"]

BACKENDS = ("gloo", "nccl")
START_METHODS = ("fork", "spawn")

_LOOPBACK = "127.0.0.1"
#: after the first failure, how long to keep collecting the other ranks' reports
_GRACE_S = 1.0
#: how long hung ranks get to print their stacks (SIGUSR1) before they are killed
_STACK_DUMP_S = 0.5
#: how long ranks get to exit on SIGTERM before SIGKILL
_TERMINATE_S = 1.0
#: the ranks' own collective timeout exceeds the launch timeout by this much, so that
#: a hang is reported by the parent as a hang rather than by gloo as a rank failure
_GROUP_TIMEOUT_MARGIN_S = 30.0
#: size of the shared-memory slot holding the collective a rank last entered
_STATUS_BYTES = 256
#: words in a traceback that mark a rank failing only because a peer went away first
_PEER_LOSS_SIGNS = ("connection closed by peer", "connection reset", "econnreset", "broken pipe",
                    "connection refused", "socket closed", "distnetworkerror")
_PR_SET_PDEATHSIG = 1


class RankFailed(Exception):
    """A rank raised or died. ``rank`` is the first that really failed, ``traceback`` its own.

    ``exitcode`` is that rank's exit code; ``others`` lists ``(rank, summary)`` of the
    ranks that failed too (usually as a consequence).
    """

    def __init__(self, rank: int, traceback: str, exitcode: Optional[int] = None,
                 others: List[Tuple[int, str]] = ()):
        self.rank = rank
        self.traceback = traceback
        self.exitcode = exitcode
        self.others = list(others)
        code = f" (exit code {exitcode})" if exitcode is not None else ""
        also = "".join(f"\n  rank {r}: {summary}" for r, summary in self.others)
        super().__init__(f"rank {rank} failed{code}:\n{traceback.rstrip()}"
                         + (f"\nother ranks failed after it:{also}" if also else ""))

    def __reduce__(self):
        return type(self), (self.rank, self.traceback, self.exitcode, self.others)


class RankTimeout(TimeoutError):
    """The launch ran past ``timeout_s``; ``ranks`` were still running.

    ``last_collectives`` maps each of them to the collective it last entered (as noted by
    :func:`zerokit.context.note_collective`); their stacks were printed to stderr.
    """

    def __init__(self, ranks: List[int], last_collectives: Dict[int, str], timeout_s: float):
        self.ranks = list(ranks)
        self.last_collectives = dict(last_collectives)
        self.timeout_s = timeout_s
        where = "; ".join(f"rank {r}: {self.last_collectives.get(r) or 'none since joining the group'}"
                          for r in self.ranks)
        super().__init__(f"launch timed out after {timeout_s:g} s with ranks {self.ranks} still running; "
                         f"last collective entered — {where} (their stacks are printed on stderr above)")

    def __reduce__(self):
        return type(self), (self.ranks, self.last_collectives, self.timeout_s)


def max_world_size(backend: Optional[str] = None) -> int:
    """The most ranks ``launch`` accepts here: one CUDA device each for NCCL, a few per CPU core for gloo.

    ``backend=None`` is the limit of whichever backend ``launch`` would then pick.
    """
    _check_backend(backend)
    gloo = max(8, 4 * (os.cpu_count() or 1))
    nccl = torch.cuda.device_count()
    return {"gloo": gloo, "nccl": nccl, None: max(gloo, nccl)}[backend]


def launch(fn: Callable[..., Any], world_size: int, *args, backend: Optional[str] = None,
           timeout_s: float = 300.0, threads_per_rank: int = 1, start_method: Optional[str] = None,
           **kwargs) -> list:
    """Run ``fn(ctx, *args, **kwargs)`` on ``world_size`` ranks and return their results by rank.

    ``ctx`` is the rank's :class:`~zerokit.context.RankContext`. ``backend`` None picks
    NCCL when there is a CUDA device per rank, else gloo. ``start_method`` None forks
    where that is safe (Linux, no process group or CUDA in this process), else spawns.
    Raises :class:`RankFailed` for the first rank that fails, :class:`RankTimeout` when
    the whole launch takes longer than ``timeout_s``; no rank outlives the call.
    Under torchrun (RANK and WORLD_SIZE set) ``fn`` runs here, as this process's rank.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r} must be a positive number of seconds")
    if isinstance(threads_per_rank, bool) or not isinstance(threads_per_rank, int) or threads_per_rank < 1:
        raise ValueError(f"threads_per_rank={threads_per_rank!r} must be an integer >= 1")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _launch_under_torchrun(fn, world_size, args, kwargs, backend, timeout_s)
    backend = _choose_backend(backend, world_size)
    method = _choose_start_method(start_method)
    if method == "fork":
        job: Any = (fn, args, kwargs)  # inherited by the fork as it is: nothing is pickled
    else:
        try:
            job = cloudpickle.dumps((fn, args, kwargs))
        except Exception as exc:
            raise TypeError(f"start_method='spawn' sends fn and its arguments to the ranks with cloudpickle, "
                            f"which failed: {type(exc).__name__}: {exc}") from exc
    return _Launch(mp.get_context(method), fn, job, world_size, backend, float(timeout_s),
                   threads_per_rank).run()


# --- choices made before any process starts -----------------------------------------------------

def _check_backend(backend: Optional[str]) -> None:
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; allowed: None (choose), {', '.join(map(repr, BACKENDS))}")


def _choose_backend(backend: Optional[str], world_size: int) -> str:
    """Validate ``backend`` and ``world_size`` together; None becomes NCCL when each rank gets a GPU.

    ``torch.cuda.device_count()`` asks NVML where it can, which, unlike
    ``torch.cuda.is_available()``, leaves CUDA uninitialised and fork safe.
    """
    _check_backend(backend)
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


def _fork_unsafe_reason() -> Optional[str]:
    if not sys.platform.startswith("linux"):
        return "fork is used on Linux only"
    if dist.is_initialized():
        return "this process already holds a process group"
    if torch.cuda.is_initialized():
        return "this process has initialised CUDA"
    return None


def _choose_start_method(start_method: Optional[str]) -> str:
    if start_method is not None and start_method not in START_METHODS:
        raise ValueError(f"start_method={start_method!r}; allowed: None (choose), "
                         f"{', '.join(map(repr, START_METHODS))}")
    unsafe = _fork_unsafe_reason()
    if start_method == "fork" and unsafe:
        raise ValueError(f"start_method='fork' is unsafe here: {unsafe}; use 'spawn' or None")
    return start_method or ("spawn" if unsafe else "fork")


def _rendezvous_socket() -> socket.socket:
    """A socket listening on a free loopback port, for rank 0's store to serve on.

    Holding it from before the ranks start means no other program can take the port
    in between, and the store listens on loopback only (with ``init_method="tcp://"``
    torch's store listens on every interface).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((_LOOPBACK, 0))
    sock.listen(128)
    return sock


# --- the rank side ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _RankSpec:
    rank: int
    world_size: int
    backend: str
    port: int
    group_timeout_s: float
    threads: int
    parent_pid: int


def _rank_main(spec: _RankSpec, job, results, stdout, stderr, status, store_socket) -> None:
    """Entry point of a rank process: tie it to the parent, join the group, run fn, report back."""
    _die_with_parent(spec.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent takes Ctrl-C and kills the ranks
    _redirect_output(stdout, stderr)
    faulthandler.enable(file=sys.stderr, all_threads=True)  # a crash prints its stacks
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # so does a hang
    set_status_writer(_status_writer(status))
    try:
        fn, args, kwargs = cloudpickle.loads(job) if isinstance(job, bytes) else job
        torch.set_num_threads(spec.threads)
        device = torch.device("cuda", spec.rank) if spec.backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        _init_process_group(spec, store_socket)
        ctx = RankContext(spec.rank, spec.world_size, device, spec.backend, groups={"world": None})
        set_current(ctx)
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


def _die_with_parent(parent_pid: int) -> None:
    """Have Linux SIGKILL this rank when the parent dies, however hard, so no rank is orphaned."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _redirect_output(stdout, stderr) -> None:
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
        slot.value = text.encode("utf-8", "replace")[:_STATUS_BYTES - 1]
    return write


def _init_process_group(spec: _RankSpec, store_socket: Optional[socket.socket]) -> None:
    """Join the group through rank 0's store on the parent's loopback socket; peers on loopback too."""
    note_collective("init_process_group")
    if sys.platform.startswith("linux"):  # gloo and NCCL would otherwise listen on the hostname's address
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    timeout = datetime.timedelta(seconds=spec.group_timeout_s)
    serve = {"master_listen_fd": store_socket.detach()} if store_socket is not None else {}
    store = dist.TCPStore(_LOOPBACK, spec.port, spec.world_size, is_master=spec.rank == 0,
                          timeout=timeout, **serve)
    dist.init_process_group(spec.backend, store=store, rank=spec.rank, world_size=spec.world_size,
                            timeout=timeout)
    note_collective("")  # joined: a hang from here on is fn's


# --- the parent side --------------------------------------------------------------------------

@dataclass
class _Failure:
    rank: int
    time: float
    traceback: str
    kind: str  # the exception's type name, or "exit"

    @property
    def peer_loss(self) -> bool:
        text = self.traceback.lower()
        return any(sign in text for sign in _PEER_LOSS_SIGNS)

    def summary(self) -> str:
        lines = [line for line in self.traceback.splitlines() if line.strip()]
        last = lines[-1].strip() if lines else self.kind
        return last[:300] + (" (lost a peer)" if self.peer_loss else "")


class _Output:
    """One rank's stdout or stderr pipe, printed whole line by whole line as ``[rN] line``."""

    def __init__(self, rank: int, reader, stream: str):
        self.reader = reader
        self.prefix = f"[r{rank}] "
        self.stream = stream  # looked up on sys at each write: in Jupyter it is the cell's stream
        self.pending = b""
        os.set_blocking(reader.fileno(), False)

    def fileno(self) -> int:
        return self.reader.fileno()

    @property
    def closed(self) -> bool:
        return self.reader.closed

    def pump(self) -> None:
        """Print the whole lines the pipe holds now; at end of file, the partial last one too."""
        if self.closed:
            return
        chunks = []
        while True:
            try:
                chunk = os.read(self.reader.fileno(), 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                self.close(b"".join(chunks))
                return
            chunks.append(chunk)
        self._print(b"".join(chunks), final=False)

    def close(self, last: bytes = b"") -> None:
        if not self.closed:
            self._print(last, final=True)
            self.reader.close()

    def _print(self, data: bytes, final: bool) -> None:
        *lines, self.pending = (self.pending + data).split(b"\n")
        if final and self.pending:
            lines.append(self.pending)
            self.pending = b""
        if lines:
            out = getattr(sys, self.stream)
            out.write("".join(f"{self.prefix}{line.decode('utf-8', 'replace')}\n" for line in lines))
            out.flush()


class _Rank:
    """The parent's handles on one rank: its process, result pipe, output pipes and status slot."""

    def __init__(self, rank: int, process, results, outputs: List[_Output], status):
        self.rank = rank
        self.process = process
        self.results = results
        self.outputs = outputs
        self.status = status
        self.value: Any = None
        self.failure: Optional[_Failure] = None
        self.reported = False  # a value or a failure arrived
        self.exited = False

    def receive(self) -> None:
        """Read the rank's one report: its return value or its failure."""
        if self.results.closed:
            return
        try:
            kind, *rest = cloudpickle.loads(self.results.recv_bytes())
        except EOFError:  # it closed the pipe without reporting; its exit tells the rest
            pass
        except Exception as exc:
            self._fail(time.time(), f"the return value of fn on rank {self.rank} could not be unpickled "
                                    f"in the launching process: {type(exc).__name__}: {exc}", "UnpicklingError")
        else:
            if kind == "ok":
                self.value, self.reported = rest[0], True
            else:
                self._fail(*rest)
        self.results.close()

    def on_exit(self) -> None:
        """The process ended: take its last report and output; no report means it died."""
        if self.exited:
            return
        self.exited = True
        self.process.join(5)  # the sentinel fires as it exits: reap it for its exit code
        if not self.results.closed and self.results.poll():
            self.receive()
        for output in self.outputs:
            output.pump()
        if not self.reported:
            code = self.process.exitcode
            how = f"exited with code {code} without raising"
            if code is not None and code < 0:
                how += f" (killed by {signal.Signals(-code).name})"
            self._fail(time.time(), f"rank {self.rank} {how}", "exit")

    def last_collective(self) -> str:
        return self.status.value.decode("utf-8", "replace")

    def _fail(self, when: float, text: str, kind: str) -> None:
        self.failure, self.reported = _Failure(self.rank, when, text, kind), True


class _Launch:
    """Start the ranks, forward their output and reports until they finish, fail or hang."""

    def __init__(self, mpctx, fn, job, world_size: int, backend: str, timeout_s: float, threads: int):
        self.mpctx = mpctx
        self.name = getattr(fn, "__name__", "fn")
        self.job = job
        self.world_size = world_size
        self.backend = backend
        self.timeout_s = timeout_s
        self.threads = threads
        self.ranks: List[_Rank] = []

    def run(self) -> list:
        try:
            self._start()
            self._supervise()
            return [rank.value for rank in self.ranks]
        finally:
            self._stop()

    def _start(self) -> None:
        sys.stdout.flush()  # what the caller printed comes before what the ranks print
        sys.stderr.flush()
        store_socket = _rendezvous_socket()
        port = store_socket.getsockname()[1]
        specs = [_RankSpec(r, self.world_size, self.backend, port, self.timeout_s + _GROUP_TIMEOUT_MARGIN_S,
                           self.threads, os.getpid()) for r in range(self.world_size)]
        spawn = self.mpctx.get_start_method() == "spawn"
        with _main_module_hidden() if spawn else contextlib.nullcontext():
            try:
                self._start_rank(specs[0], store_socket)
            finally:
                store_socket.close()  # rank 0 has it now; the other ranks need not inherit it
            for spec in specs[1:]:
                self._start_rank(spec, None)

    def _start_rank(self, spec: _RankSpec, store_socket) -> None:
        results_r, results_w = self.mpctx.Pipe(duplex=False)
        stdout_r, stdout_w = self.mpctx.Pipe(duplex=False)  # carry raw bytes: only their fds are used
        stderr_r, stderr_w = self.mpctx.Pipe(duplex=False)
        status = self.mpctx.RawArray("c", _STATUS_BYTES)
        process = self.mpctx.Process(target=_rank_main, name=f"zerokit-{self.name}-rank{spec.rank}",
                                     args=(spec, self.job, results_w, stdout_w, stderr_w, status, store_socket))
        rank = _Rank(spec.rank, process, results_r, [_Output(spec.rank, stdout_r, "stdout"),
                                                     _Output(spec.rank, stderr_r, "stderr")], status)
        self.ranks.append(rank)
        try:
            process.start()
        finally:
            for end in (results_w, stdout_w, stderr_w):  # the child's ends: its exit must close them
                end.close()

    def _supervise(self) -> None:
        """Forward output and collect reports until every rank exits; raise on failure or hang."""
        deadline = time.monotonic() + self.timeout_s
        grace_end = math.inf
        while not all(rank.exited for rank in self.ranks):
            now = time.monotonic()
            if now >= min(deadline, grace_end):
                break
            self._pump(min(deadline, grace_end) - now)
            if grace_end == math.inf and self._failures():
                grace_end = time.monotonic() + _GRACE_S
        if self._failures():
            self._raise_first_failure()
        hung = [rank for rank in self.ranks if not rank.exited]
        if hung:
            self._raise_timeout(hung)

    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` for a pipe or a process, and handle everything that is ready.

        The handlers do nothing once their pipe is closed or their process has been seen
        to exit, so an exit handled first in a round may take its rank's pipes along.
        """
        handlers: Dict[Any, Callable[[], None]] = {}
        for rank in self.ranks:
            if not rank.results.closed:
                handlers[rank.results] = rank.receive
            handlers.update((output, output.pump) for output in rank.outputs if not output.closed)
            if not rank.exited:
                handlers[rank.process.sentinel] = rank.on_exit
        for ready in mp.connection.wait(list(handlers), timeout):
            handlers[ready]()

    def _failures(self) -> List[_Failure]:
        return [rank.failure for rank in self.ranks if rank.failure is not None]

    def _raise_first_failure(self):
        """Blame the earliest failure that is not a peer-loss victim; kill the rest first."""
        self._stop()
        failures = self._failures()
        first = min(failures, key=lambda f: (f.peer_loss, f.time))
        others = [(f.rank, f.summary()) for f in failures if f is not first]
        raise RankFailed(first.rank, first.traceback, self.ranks[first.rank].process.exitcode, others)

    def _raise_timeout(self, hung: List[_Rank]):
        """Print the hung ranks' stacks (SIGUSR1 → faulthandler), kill them, report their collectives."""
        last = {rank.rank: rank.last_collective() for rank in hung}
        if hasattr(signal, "SIGUSR1"):
            for rank in hung:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rank.process.pid, signal.SIGUSR1)
            end = time.monotonic() + _STACK_DUMP_S
            while (left := end - time.monotonic()) > 0:
                self._pump(left)
        self._stop()
        raise RankTimeout([rank.rank for rank in hung], last, self.timeout_s)

    def _stop(self) -> None:
        """Terminate, then kill, and reap every rank; print what they wrote; close the pipes.

        Safe to call twice, and a second Ctrl-C during the polite part still kills.
        """
        started = [rank.process for rank in self.ranks if rank.process.pid is not None]
        try:
            for process in started:
                process.terminate()
            end = time.monotonic() + _TERMINATE_S
            for process in started:
                process.join(max(0.0, end - time.monotonic()))
        finally:
            for process in started:
                process.kill()
                process.join()
            for rank in self.ranks:
                for output in rank.outputs:
                    if not output.closed:
                        output.pump()
                        output.close()
                rank.results.close()


@contextlib.contextmanager
def _main_module_hidden():
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


# --- under torchrun ---------------------------------------------------------------------------

def _launch_under_torchrun(fn, world_size, args, kwargs, backend, timeout_s) -> list:
    """torchrun already started the ranks: run ``fn`` here as this one and gather all results.

    The first call joins the process group and keeps it for later calls (joining again
    through torchrun's store after leaving is not reliable); it is left at exit.
    """
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        raise ValueError(f"world_size={world_size!r} but torchrun started WORLD_SIZE={env_world} ranks; "
                         f"pass world_size={env_world}")
    _check_backend(backend)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    joined = dist.is_initialized()
    if joined:
        backend = dist.get_backend()
    elif backend is None:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        backend = "nccl" if torch.cuda.device_count() >= local_world else "gloo"
    device = torch.device("cuda", local_rank) if "nccl" in backend else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not joined:
        dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s))
        atexit.register(_leave_group)
    ctx = RankContext(rank, world_size, device, backend, groups={"world": None}, torchrun=True)
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
