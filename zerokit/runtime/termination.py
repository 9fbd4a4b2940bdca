"""SIGTERM and SIGHUP while ranks run: stop the ranks first, then end as the signal would have.

By default either signal ends the launching process on the spot: its ranks die with it
(PDEATHSIG, :func:`.spawn.die_with_parent`), but whatever they started — a helper
process, DataLoader workers — is orphaned and keeps running. ``timeout(1)`` sends
SIGTERM, a closed terminal SIGHUP, and a Jupyter kernel that does not shut down when
asked gets SIGTERM too.

Lifecycle: :class:`.supervise.Supervisor` runs a launch inside :func:`unwinding`. On
entry, in the main thread, each of the two signals whose disposition is the default gets
a handler instead that raises :class:`Terminated`, which unwinds the launch through the
Supervisor's ``finally`` (every rank's process group killed and reaped). A second signal
during that cleanup is noted, not raised, so the cleanup finishes. On exit the previous
dispositions come back and the first signal received is sent again, so the process ends
by it, as it would have without a launch in progress, only after its ranks. A signal the
caller handles itself, and a launch from another thread, are left alone. In a rank,
forked while the handler is in place, the handler does what the default would.

A command line ends the same way on Ctrl-C (:func:`end_by`, once the launch has stopped its
ranks), and stops the one helper a spawn-method launch leaves behind on purpose,
multiprocessing's resource tracker (:func:`stop_resource_tracker`), before it returns.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

__all__ = ["Terminated", "unwinding", "SIGNALS", "end_by", "stop_resource_tracker"]

#: the signals that end a process by default and that a user or a tool sends to stop a command
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Terminated(BaseException):
    """Raised in the launching process by SIGTERM or SIGHUP while its ranks run (not an Exception: no
    ``except Exception`` on the way out may swallow it)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def unwinding():
    """Inside, SIGTERM and SIGHUP (where they had the default disposition) unwind as :class:`Terminated`; on
    leaving, the first one received is delivered again under the previous disposition."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()
    received = []

    def handler(signum, frame):
        if os.getpid() != owner:  # a process forked inside: behave as the default would
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        received.append(signum)
        if len(received) == 1:
            raise Terminated(signum)

    previous = {}
    for sig in SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        _restore(previous, received)


def _restore(previous: dict, received: list) -> None:
    """Put the dispositions back with the signals held, so that one arriving meanwhile meets the old one."""
    held = hasattr(signal, "pthread_sigmask") and previous
    if held:
        signal.pthread_sigmask(signal.SIG_BLOCK, previous)
    try:
        for sig, old in previous.items():
            signal.signal(sig, old)
        if received:
            os.kill(os.getpid(), received[0])  # pending while held; delivered below
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, previous)


def end_by(signum: int) -> None:
    """End this process by ``signum`` under its default disposition, after flushing its output and stopping
    :func:`stop_resource_tracker`'s helper (no ``finally`` runs after this)."""
    sys.stdout.flush()
    sys.stderr.flush()
    stop_resource_tracker()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def stop_resource_tracker() -> None:
    """Stop and reap multiprocessing's resource tracker if this process started one (a spawn-method launch
    does, and keeps it for the process's life), rather than leave it to notice, after the process has ended,
    that its parent is gone."""
    tracker = getattr(sys.modules.get("multiprocessing.resource_tracker"), "_resource_tracker", None)
    if getattr(tracker, "_pid", None) is not None and hasattr(tracker, "_stop"):
        with contextlib.suppress(Exception):  # already gone: nothing to wait for
            tracker._stop()
