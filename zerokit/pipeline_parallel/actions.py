"""A pipeline schedule as data: what each rank does, in order, written like torch's IR.

An :class:`Action` is one thing one rank does for one micro-batch on one *stage*. With
``chunks=v`` every rank holds ``v`` model chunks, so the model has ``p·v`` (virtual)
stages; stage ``s`` lives on rank ``s % p`` as its chunk ``s // p`` (Megatron's
interleaving: rank 0 holds stages 0, p, 2p, …). Without interleaving stage = rank.

The kinds and their short strings are torch.distributed.pipelining's (``_ComputationType``):

======== ===================================================================
``F``     forward of a micro-batch through the stage
``B``     full backward (input and weight gradients together)
``I``     backward for the *input* gradient only (what the zero-bubble paper calls B)
``W``     backward for the *weight* gradients only (the paper's W), deferrable
``SEND_F`` / ``RECV_F``  the forward activation to / from the next / previous stage
``SEND_B`` / ``RECV_B``  the gradient of that activation, the other way
======== ===================================================================

``str(Action(1, "F", 0)) == "1F0"``; ``"0B3"``, ``"2W1"``, ``"3SEND_F1"`` read the same way
as torch's, so a schedule prints as a table of short strings and can be compared with
torch's own. (The zero-bubble paper's "B" is torch's ``I``: we keep torch's letters and
say so here, because a learner meets them in torch's schedules and logs.)

A :class:`Schedule` holds one ordered list of actions per rank, communication included:
``RECV_F`` before a forward that needs an activation, ``SEND_F`` after it, and the same
for gradients. Schedules are built by pure functions (:mod:`.schedules`), run without
processes by :func:`zerokit.simulate` and with processes by the executor.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List

COMPUTE = ("F", "B", "I", "W")
COMMUNICATE = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
KINDS = COMPUTE + COMMUNICATE
_PATTERN = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")


@dataclass(frozen=True, order=True)
class Action:
    """One step of one rank: ``kind`` (see the module docstring) of micro-batch ``micro`` on stage ``stage``."""

    stage: int
    kind: str
    micro: int

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Action kind={self.kind!r}; allowed: {', '.join(KINDS)}")
        if self.stage < 0 or self.micro < 0:
            raise ValueError(f"Action stage={self.stage}, micro={self.micro} must be >= 0")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.micro}"

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE

    @classmethod
    def parse(cls, text: str) -> "Action":
        """``Action.parse("1F0") == Action(1, "F", 0)``."""
        match = _PATTERN.match(text.strip())
        if not match:
            raise ValueError(f"{text!r} is not an action; write stage, kind, micro-batch like '1F0' or '2SEND_B3'")
        return cls(int(match.group(1)), match.group(2), int(match.group(3)))


@dataclass
class Schedule:
    """A pipeline schedule: ``actions[r]`` is rank r's ordered list of actions."""

    name: str
    #: pipeline ranks p
    ranks: int
    #: micro-batches m per step
    micro_batches: int
    #: model chunks per rank v (1 without interleaving)
    chunks: int
    actions: List[List[Action]] = field(default_factory=list)

    @property
    def stages(self) -> int:
        """Virtual stages: ranks × chunks."""
        return self.ranks * self.chunks

    def rank_of(self, stage: int) -> int:
        return stage % self.ranks

    def compute(self, rank: int) -> List[Action]:
        """Rank ``rank``'s compute actions only, in order."""
        return [a for a in self.actions[rank] if a.is_compute]

    @property
    def splits_backward(self) -> bool:
        """True when backward is split into I and W (zero-bubble schedules)."""
        return any(a.kind in ("I", "W") for row in self.actions for a in row)

    def table(self, compute_only: bool = True) -> str:
        """The schedule as text: one row per rank, one column per action slot."""
        rows = [self.compute(r) if compute_only else self.actions[r] for r in range(self.ranks)]
        width = max((len(str(a)) for row in rows for a in row), default=3)
        lines = [f"{self.name}: p={self.ranks}, m={self.micro_batches}, v={self.chunks}"]
        for r, row in enumerate(rows):
            lines.append(f"rank {r}: " + " ".join(str(a).rjust(width) for a in row))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def as_dict(self) -> Dict:
        return {"name": self.name, "ranks": self.ranks, "micro_batches": self.micro_batches,
                "chunks": self.chunks, "actions": [[str(a) for a in row] for row in self.actions]}
