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
across nodes, :meth:`zerokit.runtime.mesh.Mesh.carve`).
"""
from __future__ import annotations

import os
from typing import Iterable

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
