"""Nodes: which ranks share a machine, and whether a process group stays inside one.

A cluster's ranks are numbered node by node: torchrun gives node ``GROUP_RANK`` the global
ranks ``GROUP_RANK · LOCAL_WORLD_SIZE`` … ``+ LOCAL_WORLD_SIZE − 1`` (``--nproc-per-node``
workers each, every node alike). zerokit reads that layout here, once per question:

- under torchrun, ``LOCAL_WORLD_SIZE`` is the node size;
- under ``zerokit.launch`` on one machine, ``ZEROKIT_RANKS_PER_NODE`` (set by the launcher when
  a job asks for emulated nodes) is; without it every rank is on one node.

Strategies ask :func:`ranks_per_node` for the default shard group of HSDP and hpZ (one node),
the link asks :func:`spans_nodes` which tier a group's collective runs on, and the ledger
names groups by the mesh axes they belong to (``dp_shard`` inside a node, ``dp_replicate``
across nodes, :meth:`zerokit.runtime.mesh.Mesh.carve`; ``node`` and ``inter_node``,
:meth:`~zerokit.runtime.mesh.Mesh.node_groups`).

When a node is lost (its machine down, its torchrun agent killed, its ranks crashed), the ranks
left see a torch error from their next collective ("Connection closed by peer", a timeout).
:mod:`.torchrun` then finds which ranks no longer answer and raises :class:`NodeLost`, whose
message :func:`describe_gone` writes: ``node 1 (ranks 2, 3) is gone``. On gloo only: on NCCL
torch's watchdog tears the ranks left down before Python sees an error (:mod:`.node_loss`).
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, List

#: the node size ``zerokit.launch`` sets in every rank's environment when a job emulates several nodes
RANKS_PER_NODE_ENV = "ZEROKIT_RANKS_PER_NODE"


def ranks_per_node(world_size: int) -> int:
    """Ranks on each node: torchrun's ``LOCAL_WORLD_SIZE``, else the launcher's emulated node size, else the world."""
    for name in ("LOCAL_WORLD_SIZE", RANKS_PER_NODE_ENV):
        value = os.environ.get(name)
        if value:
            size = int(value)
            if size < 1 or world_size % size:
                raise ValueError(f"{name}={value} does not divide the world size {world_size}: nodes must hold "
                                 f"equal numbers of ranks")
            return size
    return world_size


def node_of(rank: int, per_node: int) -> int:
    """The node holding global ``rank`` (ranks numbered node by node)."""
    return rank // per_node


def spans_nodes(ranks: Iterable[int], per_node: int) -> bool:
    """Whether a group of global ``ranks`` has members on more than one node."""
    return len({node_of(r, per_node) for r in ranks}) > 1


def node_ranks(node: int, per_node: int) -> List[int]:
    """The global ranks on ``node``."""
    return list(range(node * per_node, (node + 1) * per_node))


def _listed(ranks) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def describe_gone(gone: Iterable[int], per_node: int) -> str:
    """The lost ranks by node: ``node 1 (ranks 2, 3) is gone`` for a whole node, ``rank 3 of node 1 is gone`` for
    part of one; several joined with ``;``."""
    by_node: Dict[int, List[int]] = {}
    for rank in sorted(set(gone)):
        by_node.setdefault(node_of(rank, per_node), []).append(rank)
    parts = []
    for node, ranks in by_node.items():
        if ranks == node_ranks(node, per_node):
            parts.append(f"node {node} ({_listed(ranks)}) is gone")
        else:
            parts.append(f"{_listed(ranks)} of node {node} {'is' if len(ranks) == 1 else 'are'} gone")
    return "; ".join(parts)


class NodeLost(RuntimeError):
    """Some ranks of the job no longer answer: raised on the ranks left, from the torch error that showed it (on
    gloo; on NCCL torch's watchdog ends the ranks first, :data:`.node_loss.NCCL_NOTE`).

    ``gone``: the global ranks lost; ``nodes``: the nodes they were on; ``per_node``: ranks per node."""

    def __init__(self, message: str, gone: Iterable[int] = (), per_node: int = 1):
        super().__init__(message)
        self.gone = sorted(set(gone))
        self.per_node = per_node
        self.nodes = sorted({node_of(r, per_node) for r in self.gone})

    def __reduce__(self):
        return type(self), (self.args[0], self.gone, self.per_node)
