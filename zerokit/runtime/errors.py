"""The two ways ``zerokit.launch`` fails once its ranks have started.

Lifecycle: the supervision loop (:mod:`.supervise`) builds one of these after it has
stopped and reaped every rank, and raises it from ``launch`` in the calling process.
:class:`RankFailed` names the first rank that really failed, with that rank's own
traceback; :class:`RankTimeout` names the ranks still running at the deadline (or at a
stall) and the collective each is in, grouped by call. Both pickle (``__reduce__``), so they can cross a
process boundary again, e.g. from a launch made inside a worker.

:class:`UsageError` is the command line's: bad input, printed as ``zerokit: error: …`` by
:mod:`zerokit.cli` and by each subcommand's own parser (bench, grade, plan), which sit below it.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

__all__ = ["RankFailed", "RankTimeout", "UsageError"]


class UsageError(ValueError):
    """Bad input on the command line: printed as ``zerokit: error: …``, exit status 2."""


class RankFailed(Exception):
    """A rank raised or died. ``rank`` is the first that really failed, ``traceback`` its own.

    ``exitcode`` is that rank's exit code; ``others`` lists ``(rank, summary)`` of the
    ranks that failed too (usually as a consequence); ``where`` says where each rank was,
    grouped ("rank 0 is finished (fn returned after 6 collectives); rank 1 is in all_reduce
    #9 of backward (...)"), and, when a rank returned while another still waited, that the ranks
    did not call the same collectives.
    """

    def __init__(self, rank: int, traceback: str, exitcode: Optional[int] = None,
                 others: List[Tuple[int, str]] = (), where: str = ""):
        self.rank = rank
        self.traceback = traceback
        self.exitcode = exitcode
        self.others = list(others)
        self.where = where
        code = f" (exit code {exitcode})" if exitcode is not None else ""
        also = "".join(f"\n  rank {r}: {summary}" for r, summary in self.others)
        super().__init__(f"rank {rank} failed{code}:\n{traceback.rstrip()}"
                         + (f"\nother ranks failed after it:{also}" if also else "")
                         + (f"\nwhere the ranks were: {where}" if where else ""))

    def __reduce__(self):
        return type(self), (self.rank, self.traceback, self.exitcode, self.others, self.where)


class RankTimeout(TimeoutError):
    """The launch ran past ``timeout_s``, or stalled for ``stalled_s`` (``heartbeat_s``); ``ranks`` were still running.

    ``last_collectives`` maps each of them to the collective it is in or last entered
    (as noted in its status slot, :mod:`zerokit.runtime.hang`); ``where`` groups the
    ranks by the call they are stuck in ("rank 2 is in all_gather #14 of forward; ranks
    0, 1, 3 are in reduce_scatter #9 of backward"). Their stacks were printed to stderr.
    """

    def __init__(self, ranks: List[int], last_collectives: Dict[int, str], timeout_s: float,
                 where: str = "", stalled_s: Optional[float] = None):
        self.ranks = list(ranks)
        self.last_collectives = dict(last_collectives)
        self.timeout_s = timeout_s
        self.where = where or "; ".join(f"rank {r}: {self.last_collectives.get(r) or 'none since joining the group'}"
                                        for r in self.ranks)
        self.stalled_s = stalled_s
        if stalled_s is not None:
            how = (f"launch stalled: no rank entered or left a collective for {stalled_s:.1f} s "
                   f"(heartbeat_s), before the {timeout_s:g} s timeout")
        else:
            how = f"launch timed out after {timeout_s:g} s"
        super().__init__(f"{how}, with ranks {self.ranks} still running: {self.where} "
                         f"(their stacks are printed on stderr above)")

    def __reduce__(self):
        return type(self), (self.ranks, self.last_collectives, self.timeout_s, self.where, self.stalled_s)
