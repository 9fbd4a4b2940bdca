"""Hang diagnosis: what each rank's status slot says, grouped into one sentence, and the debug-mode check.

Lifecycle: a rank writes its slot (:mod:`.context`) as it enters, waits in and leaves
each collective (:mod:`.comm`); the text is :func:`encode`'s, five fields — state,
call number, op, phase, detail. When ranks hang or stall, the parent
(:mod:`.supervise`) reads every slot with :func:`decode` and :func:`summarise` groups
the ranks by the call they are stuck in: "rank 2 is in all_gather #14 of forward;
ranks 0, 1, 3 are in reduce_scatter #9 of backward". On NCCL a call returns when its
collective is queued on the GPU, so there the sentence names the collective each rank
last enqueued.

In debug mode (``zerokit.launch(..., check_collectives=True)`` or
``ZEROKIT_DEBUG_COLLECTIVES=1``), :func:`check_signature` runs before each symmetric
collective: a small all-gather of (op, numel, dtype, phase, call) on the same group,
and a :class:`CollectiveMismatch` naming both sides when the ranks disagree — as
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` does for gloo — instead of a hang or garbage.
"""
from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass
from typing import Dict, List

import torch
import torch.distributed as dist

from .context import STATUS_SEPARATOR as _SEP, backend_device, encode

#: states a slot can hold: "" nothing yet, "init" joining the group, "idle" joined, "in" inside a
#: blocking collective, "launched" an async one issued, "wait" waiting for one, "out" left one
WAITING = ("in", "wait", "init")
#: the collectives whose (op, numel, dtype) must agree on every rank of the group
SYMMETRIC_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
_PHASES = ("setup", "forward", "backward", "step")
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


@dataclass(frozen=True)
class RankStatus:
    state: str = ""
    call: int = 0
    op: str = ""
    phase: str = ""
    detail: str = ""

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    def where(self) -> str:
        """``all_gather #14 of forward (1024 float32 on dp, step 3)``, or the free-form description."""
        if self.state == "init":
            return "init_process_group (joining the group)"
        if not self.op:
            return self.detail or "no collective"
        return f"{self.op} #{self.call} of {self.phase}" + (f" ({self.detail})" if self.detail else "")

    def sentence_part(self, backend: str = "gloo") -> str:
        """Where the rank is, in words. On NCCL a collective's call returns once it is queued on the GPU, and
        ``Work.wait`` only orders streams: the slot knows what the rank last *enqueued*, not whether it finished,
        and the sentence says so."""
        if self.state in ("", "idle"):
            return "in no collective since joining the group"
        if self.state == "init":
            return "in " + self.where()
        if backend == "nccl":
            return (f"past the last collective it enqueued, {self.where()} (NCCL returns once a collective is "
                    f"queued on the GPU: it may still be running there, or waiting for a peer)")
        if self.state == "in":
            return f"in {self.where()}"
        if self.state == "wait":
            return f"waiting for async {self.where()}"
        if self.state == "launched":
            return f"not in a collective (last launched async {self.where()}, not waited for)"
        return f"not in a collective (last left {self.where()})"


def decode(text: str) -> RankStatus:
    """The slot's text as a :class:`RankStatus`; text without separators is a bare description."""
    parts = text.split(_SEP)
    if len(parts) != 5:
        return RankStatus("in" if text else "", 0, "", "", text)
    state, call, op, phase, detail = parts
    try:
        number = int(call)
    except ValueError:
        number = 0
    return RankStatus(state, number, op, phase, detail)


def _ranks(ranks: List[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]} is"
    return "ranks " + ", ".join(map(str, ranks)) + " are"


def summarise(statuses: Dict[int, RankStatus], backend: str = "gloo") -> str:
    """Group the ranks by where they are: 'rank 2 is in all_gather #14 of forward; ranks 0, 1 are in ...'
    (on NCCL: what each last enqueued)."""
    return group_sentences({rank: status.sentence_part(backend) for rank, status in statuses.items()})


def group_sentences(parts: Dict[int, str]) -> str:
    """Join ``{rank: "in all_reduce #3 of backward"}`` into one sentence, ranks with the same part together."""
    groups: Dict[str, List[int]] = {}
    for rank in sorted(parts):
        groups.setdefault(parts[rank], []).append(rank)
    ordered = sorted(groups.items(), key=lambda item: (len(item[1]), item[1]))  # the odd one out first
    return "; ".join(f"{_ranks(ranks)} {part}" for part, ranks in ordered)


# --- debug mode: compare signatures before entering --------------------------------------------

#: torch's own all-gather, taken at import: the grader's probe and the peers' recording replace
#: ``dist.all_gather_into_tensor`` with wrappers that record (and would check) it again
_all_gather = dist.all_gather_into_tensor
_checking = threading.local()


class CollectiveMismatch(RuntimeError):
    """The ranks of a group entered different collectives (op, element count or dtype)."""


def _code(table, value) -> int:
    return table.index(value) if value in table else zlib.crc32(str(value).encode()) & 0x7FFFFFFF


def _name(table, code: int) -> str:
    return str(table[code]).replace("torch.", "") if 0 <= code < len(table) else f"<{code}>"


def check_signature(op: str, numel: int, dtype: torch.dtype, phase: str, call: int, group, axis: str) -> None:
    """All-gather this rank's (op, numel, dtype) on ``group`` and raise on any disagreement."""
    if op not in SYMMETRIC_OPS or not dist.is_initialized() or getattr(_checking, "active", False):
        return
    _checking.active = True
    try:
        _check(op, numel, dtype, phase, call, group, axis)
    finally:
        _checking.active = False


def _check(op: str, numel: int, dtype: torch.dtype, phase: str, call: int, group, axis: str) -> None:
    n = dist.get_world_size(group)
    if n == 1:
        return
    device = backend_device(str(dist.get_backend(group)))
    mine = torch.tensor([_code(SYMMETRIC_OPS, op), numel, _code(_DTYPES, dtype), _code(_PHASES, phase), call],
                        dtype=torch.int64, device=device)
    every = torch.empty(n * mine.numel(), dtype=torch.int64, device=device)
    _all_gather(every, mine, group=group)
    rows = every.view(n, -1).tolist()
    if all(row[:3] == rows[0][:3] for row in rows):
        return
    members = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    sides: Dict[tuple, List[int]] = {}
    for member, row in zip(members, rows):
        sides.setdefault(tuple(row[:3]), []).append(member)
    described = []
    for (op_code, count, dtype_code), ranks in sides.items():
        example = rows[members.index(ranks[0])]
        described.append(f"{_ranks(ranks)} in {_name(SYMMETRIC_OPS, op_code)} of {count} "
                         f"{_name(_DTYPES, dtype_code)} (#{example[4]} of {_name(_PHASES, example[3])})")
    raise CollectiveMismatch(f"collective mismatch on the {axis} group (ranks {members}): " + "; ".join(described)
                             + ". Every rank of a group must call the same collectives, in the same order, "
                               "on tensors of the same size and dtype (checked because check_collectives / "
                               "ZEROKIT_DEBUG_COLLECTIVES=1 is on)")
