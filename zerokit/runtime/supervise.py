"""The parent's side of a launch: start the ranks, watch them, blame, time out, kill and reap.

Lifecycle (:meth:`Supervisor.run`):

1. *start* — flush the caller's output, bind the rendezvous socket, start one process
   per rank (:func:`.spawn.rank_main`) with a results pipe, two output pipes and a
   shared status slot each; rank 0 takes the socket, the parent closes its copy.
2. *supervise* — wait on every pipe and process sentinel at once: forward output
   lines, take each rank's one report (value or failure), note each exit (an exit
   without a report is a failure too). The loop ends when every rank has exited, at
   the deadline (``timeout_s``), or ``_GRACE_S`` after the first failure, which gives
   the other ranks time to report theirs.
3. *blame* — on failure, stop every rank and raise :class:`.errors.RankFailed` for the
   earliest failure that is not a mere peer-loss victim, saying where each rank was (the
   collective it was in, or that it had returned or died); on a hang, send SIGUSR1 so
   each hung rank prints its stacks, then stop them and raise
   :class:`.errors.RankTimeout` naming, per rank, the collective it is in (grouped by
   call, :mod:`.hang`). With ``heartbeat_s``, a stall — no rank entered, waited in or left
   a collective for that long — ends the loop the same way, before the deadline.
4. *stop* — on every path (return, raise, Ctrl-C, and SIGTERM or SIGHUP, which unwind
   the launch first and end the process afterwards, :mod:`.termination`), SIGTERM then
   SIGKILL every rank's whole process group (``os.killpg``: each rank leads one,
   :func:`.spawn.own_session`), so what a rank started dies with it even after the rank
   exited; reap the ranks and wait until nothing in their groups runs
   (:mod:`.process_group`), so the launch returns after every process it started; print
   what is left in the pipes, close them. An ``atexit`` hook kills the groups of launches
   still running at interpreter exit (in a daemon thread). A parent killed hard
   (SIGKILL) takes its ranks along (PDEATHSIG) but nothing is left to kill their children.
"""
from __future__ import annotations

import atexit
import contextlib
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional

from .errors import RankFailed, RankTimeout
from .hang import group_sentences, summarise
from .output import LineForwarder
from .process_group import signal_rank, wait_gone
from .rank_handle import RankHandle, _Failure
from .spawn import STATUS_BYTES, RankSpec, main_module_hidden, rank_main, rendezvous_socket
from .termination import unwinding

#: after the first failure, how long to keep collecting the other ranks' reports
_GRACE_S = 1.0
#: how long hung ranks get to print their stacks (SIGUSR1) before they are killed
_STACK_DUMP_S = 0.5
#: how long ranks get to exit on SIGTERM before SIGKILL
_TERMINATE_S = 1.0
#: after SIGKILL, the longest wait for what the ranks started to be gone (a process in uninterruptible sleep
#: may take longer: the launch then returns without it)
_GROUP_EXIT_S = 10.0
#: the ranks' own collective timeout exceeds the launch timeout by this much, so that
#: a hang is reported by the parent as a hang rather than by gloo as a rank failure
_GROUP_TIMEOUT_MARGIN_S = 30.0


class Supervisor:
    """Start the ranks, forward their output and reports until they finish, fail or hang."""

    def __init__(self, mpctx, fn, job, world_size: int, backend: str, timeout_s: float, threads: int,
                 heartbeat_s: Optional[float] = None, check_collectives: Optional[bool] = None):
        self.heartbeat_s = heartbeat_s
        self.check_collectives = check_collectives
        self.mpctx = mpctx
        self.name = getattr(fn, "__name__", "fn")
        self.job = job
        self.world_size = world_size
        self.backend = backend
        self.timeout_s = timeout_s
        self.threads = threads
        self.ranks: List[RankHandle] = []
        self.owner_pid = os.getpid()

    def run(self) -> list:
        with unwinding():  # SIGTERM, SIGHUP: raised here, so that the finally below stops the ranks first
            with _ACTIVE_LOCK:
                _ACTIVE.add(self)
            try:
                self._start()
                self._supervise()
                return [rank.value for rank in self.ranks]
            finally:
                try:
                    self._stop()
                finally:
                    with _ACTIVE_LOCK:
                        _ACTIVE.discard(self)

    def _start(self) -> None:
        sys.stdout.flush()  # what the caller printed comes before what the ranks print
        sys.stderr.flush()
        store_socket = rendezvous_socket()
        port = store_socket.getsockname()[1]
        specs = [RankSpec(r, self.world_size, self.backend, port, self.timeout_s + _GROUP_TIMEOUT_MARGIN_S,
                          self.threads, os.getpid(), self.check_collectives) for r in range(self.world_size)]
        spawn = self.mpctx.get_start_method() == "spawn"
        with main_module_hidden() if spawn else contextlib.nullcontext():
            try:
                self._start_rank(specs[0], store_socket)
            finally:
                store_socket.close()  # rank 0 has it now; the other ranks need not inherit it
            for spec in specs[1:]:
                self._start_rank(spec, None)

    def _start_rank(self, spec: RankSpec, store_socket) -> None:
        results_r, results_w = self.mpctx.Pipe(duplex=False)
        stdout_r, stdout_w = self.mpctx.Pipe(duplex=False)  # carry raw bytes: only their fds are used
        stderr_r, stderr_w = self.mpctx.Pipe(duplex=False)
        status = self.mpctx.RawArray("c", STATUS_BYTES)
        process = self.mpctx.Process(target=rank_main, name=f"zerokit-{self.name}-rank{spec.rank}",
                                     args=(spec, self.job, results_w, stdout_w, stderr_w, status, store_socket))
        rank = RankHandle(spec.rank, process, results_r, [LineForwarder(spec.rank, stdout_r, "stdout"),
                                                     LineForwarder(spec.rank, stderr_r, "stderr")], status,
                          self.backend)
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
        beat = _Heartbeat(self.heartbeat_s, self.ranks)
        stalled = None
        while not all(rank.exited for rank in self.ranks):
            now = time.monotonic()
            if now >= min(deadline, grace_end):
                break
            if grace_end == math.inf and (stalled := beat.stalled(now)) is not None:
                break
            self._pump(min(deadline, grace_end, now + beat.poll_s) - now)
            if grace_end == math.inf and self._failures():
                grace_end = time.monotonic() + _GRACE_S
        if self._failures():
            self._raise_first_failure()
        hung = [rank for rank in self.ranks if not rank.exited]
        if hung:
            self._raise_timeout(hung, stalled)

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
        raise RankFailed(first.rank, first.traceback, self.ranks[first.rank].process.exitcode, others,
                         self._where())

    def _where(self) -> str:
        """Where each rank was, grouped; a rank that returned while another lost it is a collective called on
        only some ranks (or a different number of times), and the sentence says so."""
        where = group_sentences({rank.rank: rank.where_part() for rank in self.ranks})
        returned = [rank.rank for rank in self.ranks if rank.reported and rank.failure is None]
        lost = [f.rank for f in self._failures() if f.peer_loss]
        if returned and lost:
            where += (f". {_names(returned)} returned while {_names(lost)} still waited in a collective: the "
                      f"ranks did not call the same collectives (one called on some ranks only, or a different "
                      f"number of times: a forgotten no_sync, uneven data); check_collectives=True stops at the first "
                      f"call whose op, size or dtype differs across the ranks")
        return where

    def _raise_timeout(self, hung: List[RankHandle], stalled_s: Optional[float] = None):
        """Print the hung ranks' stacks (SIGUSR1 → faulthandler), kill them, report their collectives
        grouped by the call each is in."""
        last = {rank.rank: rank.last_collective() for rank in hung}
        where = summarise({rank.rank: rank.state() for rank in hung}, self.backend)
        if hasattr(signal, "SIGUSR1"):
            for rank in hung:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rank.process.pid, signal.SIGUSR1)
            end = time.monotonic() + _STACK_DUMP_S
            while (left := end - time.monotonic()) > 0:
                self._pump(left)
        self._stop()
        raise RankTimeout([rank.rank for rank in hung], last, self.timeout_s, where, stalled_s)

    def _stop(self) -> None:
        """Terminate, then kill, and reap every rank; print what they wrote; close the pipes.

        Safe to call twice, and a second Ctrl-C during the polite part still kills.
        """
        started = [rank.process for rank in self.ranks if rank.process.pid is not None]
        try:
            for process in started:
                signal_rank(process, signal.SIGTERM)
            end = time.monotonic() + _TERMINATE_S
            for process in started:
                process.join(max(0.0, end - time.monotonic()))
        finally:
            for process in started:
                signal_rank(process, signal.SIGKILL)
                process.join()
            wait_gone([process.pid for process in started], _GROUP_EXIT_S)
            for rank in self.ranks:
                for output in rank.outputs:
                    if not output.closed:
                        output.pump()
                        output.close()
                rank.results.close()

    def kill_now(self) -> None:
        """SIGKILL every rank's group, from the ``atexit`` hook: no waiting, no printing."""
        for rank in list(self.ranks) if os.getpid() == self.owner_pid else ():  # not in a fork
            if rank.process.pid is not None:
                signal_rank(rank.process, signal.SIGKILL)


class _Heartbeat:
    """Notices a stall: no rank entered, waited in or left a collective (nor exited) for ``heartbeat_s``,
    counted once every rank has joined the group."""

    def __init__(self, heartbeat_s: Optional[float], ranks: List[RankHandle]):
        self.heartbeat_s = heartbeat_s
        self.ranks = ranks
        self.poll_s = math.inf if heartbeat_s is None else min(0.25, heartbeat_s / 4)
        self.seen: Optional[tuple] = None
        self.since = time.monotonic()

    def stalled(self, now: float) -> Optional[float]:
        """Seconds without progress once that reaches ``heartbeat_s``, else None."""
        if self.heartbeat_s is None:
            return None
        states = [rank.state() for rank in self.ranks]
        snapshot = tuple((rank.exited, rank.status_text()) for rank in self.ranks)
        if snapshot != self.seen or any(s.state in ("", "init") for s in states):
            self.seen, self.since = snapshot, now
            return None
        return now - self.since if now - self.since >= self.heartbeat_s else None


def _names(ranks: List[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


#: launches in progress in this process, for the atexit hook
_ACTIVE: "weakref.WeakSet[Supervisor]" = weakref.WeakSet()
_ACTIVE_LOCK = threading.Lock()


@atexit.register
def _kill_active_launches() -> None:
    """Kill the ranks' groups of launches still running (in a daemon thread) at interpreter exit.

    Registered after multiprocessing's own hook, so it runs first: multiprocessing then
    joins dead ranks instead of waiting forever on hung ones."""
    with _ACTIVE_LOCK:
        active = list(_ACTIVE)
    for launch in active:
        launch.kill_now()
