"""A rank's process group, from the parent's side: signal all of it, then wait until none of it runs.

Lifecycle: each rank makes itself the leader of a session and process group whose id is
its pid (:func:`.spawn.own_session`), so what it starts — DataLoader workers, a helper
process — is in that group. To stop a rank, :class:`.supervise.Supervisor` sends its
signals to the whole group (:func:`signal_rank`); after SIGKILL it reaps the rank and
calls :func:`wait_gone`, which returns once no live process is left in any of the groups
(or after ``timeout_s``), so that a launch returns only after what its ranks started has
exited too — a SIGKILLed process takes a moment to go, longer on a loaded machine, and a
rank's orphaned children are reaped by init, not by us. A zombie has exited and does not
count (whether init reaps it is not ours to wait for).
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Iterable

#: the first and the longest pause between two looks at the groups
_FIRST_POLL_S = 0.002
_LONGEST_POLL_S = 0.05


def signal_rank(process, sig: int) -> None:
    """Send ``sig`` to the rank's process group (its id is the rank's pid, and it outlives
    the rank while anything the rank started runs), and to the rank itself, which may not
    have made its group yet (it has then started nothing)."""
    if hasattr(os, "killpg"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
    if process.exitcode is None:  # not reaped yet, so the pid is still this rank's
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, sig)


def wait_gone(pgids: Iterable[int], timeout_s: float) -> bool:
    """Wait until no live process is in any group of ``pgids``, up to ``timeout_s``; True when none is."""
    pgids = set(pgids)
    end = time.monotonic() + timeout_s
    pause = _FIRST_POLL_S
    while True:
        pgids = {pgid for pgid in pgids if _exists(pgid)}
        if pgids and os.path.isdir("/proc"):
            pgids &= _live_groups()  # members there, but all zombies: they have exited
        if not pgids:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(pause)
        pause = min(2 * pause, _LONGEST_POLL_S)


def _exists(pgid: int) -> bool:
    """Whether the group has any member, zombies included."""
    if not hasattr(os, "killpg"):
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal: not one of ours
        return False
    return True


def _live_groups() -> set:
    """The process group ids of every process on this machine that is not a zombie (Linux's /proc)."""
    groups = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it ended while we looked
            continue
        fields = stat.rsplit(b")", 1)[-1].split()  # the name, in parentheses, may hold anything
        if len(fields) > 2 and fields[0] not in (b"Z", b"X"):
            groups.add(int(fields[2]))
    return groups
