"""The parent's handles on one rank of a launch (:class:`RankHandle`) and on a rank's failure.

Lifecycle: :class:`.supervise.Supervisor` makes one handle per rank as it starts the
rank; its supervision loop calls :meth:`RankHandle.receive` when the results pipe is
ready and :meth:`RankHandle.on_exit` when the process ends; on a hang, a stall or a
failure it reads each rank's status slot (:meth:`RankHandle.state`, :mod:`.hang`'s format)
to say where the rank was (:meth:`RankHandle.where_part`).
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Any, List, Optional

import cloudpickle

from .hang import RankStatus, decode
from .output import LineForwarder

#: words in a traceback that mark a rank failing only because a peer went away first
_PEER_LOSS_SIGNS = ("connection closed by peer", "connection reset", "econnreset", "broken pipe",
                    "connection refused", "socket closed", "distnetworkerror")


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


class RankHandle:
    """The parent's handles on one rank: its process, result pipe, output pipes and status slot."""

    def __init__(self, rank: int, process, results, outputs: List[LineForwarder], status, backend: str = "gloo"):
        self.rank = rank
        #: the backend the rank's collectives ran on: NCCL's slot records enqueues (:mod:`.hang`)
        self.backend = backend
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
            if self.state().state not in ("", "idle"):  # where it died: the collective it was in or last left
                how += f", {self.state().sentence_part(self.backend)}"
            self._fail(time.time(), f"rank {self.rank} {how}", "exit")

    def status_text(self) -> str:
        return self.status.value.decode("utf-8", "replace")

    def state(self) -> RankStatus:
        """Where the rank is: the collective it is in (or last left), from its status slot."""
        return decode(self.status_text())

    def where_part(self) -> str:
        """Where the rank was when the launch failed: returned (after which call), died, or its collective."""
        status = self.state()
        if self.reported and self.failure is None:
            return f"finished (fn returned after {status.call} collective{'s' if status.call != 1 else ''})"
        prefix = "dead; it was " if self.failure is not None and self.failure.kind == "exit" else ""
        return prefix + status.sentence_part(self.backend)

    def last_collective(self) -> str:
        """The collective it is in or last entered, as one line ("" when none since joining)."""
        status = self.state()
        return "" if status.state in ("", "idle") else status.where()

    def _fail(self, when: float, text: str, kind: str) -> None:
        self.failure, self.reported = _Failure(self.rank, when, text, kind), True


