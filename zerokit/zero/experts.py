"""ZeRO with expert parallelism: expert and dense parameters sharded over their own groups.

With ``ep`` carved from dp (:mod:`zerokit.expert_parallel`), a MoE layer's experts differ across
the ep ranks of a group and are equal on the N_e = dp / ep ranks that hold the same ones
(``edp``: DeepSpeed-MoE's expert-data-parallel group, Megatron's ``expert_data_parallel_group``).
ZeRO shards each kind of parameter over the ranks that hold it:

- **dense** parameters live in flat units padded to a multiple of N = dp and sharded over ``dp``,
  exactly as without experts;
- **expert** parameters (marked ``_zerokit_expert``) live in flat units of their own — never shared
  with a dense parameter — padded to a multiple of N_e and sharded over ``edp``.

Lifecycle of one step, per unit, on its own group: the gradients are divided by N = dp (not N_e:
an expert's gradient already holds the sum over its ep group's tokens, which the combine's
backward brought home) and reduce-scattered; each rank steps its shards (the optimizer state of
an expert unit is 1/N_e of this rank's experts, 1/dp of every expert of the layer); the updated
parameters are all-gathered (ZeRO-1/2 after the step, ZeRO-3 before each forward and backward).
A group of one rank (ep = dp) communicates nothing: the unit is its own shard.

The formulas: :func:`zerokit.theory.expert_zero_model_state_bytes` and
:func:`zerokit.theory.expert_zero_comm_bytes`.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..data_parallel.base import check_replicas_match


class ShardGroup(NamedTuple):
    """The ranks a unit is sharded over: the mesh axis, its process group, its size and this rank's place."""

    axis: str
    group: object
    world: int
    rank: int


def is_expert(p: torch.Tensor) -> bool:
    return getattr(p, "_zerokit_expert", False)


def expert_parallel(strategy) -> bool:
    return strategy.ctx.mesh.size("ep") > 1


def shard_groups(strategy):
    """(dense group, expert group or None without expert parallelism) of a ZeRO strategy."""
    dense = ShardGroup("dp", strategy.group, strategy.world, strategy.rank)
    if not expert_parallel(strategy):
        return dense, None
    mesh = strategy.ctx.mesh
    return dense, ShardGroup("edp", mesh.group("edp"), mesh.size("edp"), mesh.coord("edp"))


def check_expert_options(strategy) -> None:
    """Refuse what ZeRO does not compose with expert parallelism yet, before anything is built."""
    if not expert_parallel(strategy):
        return
    if strategy.opts.get("offload", "none") != "none":
        raise ValueError(f"strategy {strategy.name!r} with parallel ep={strategy.ctx.mesh.size('ep')}: offload is not "
                         f"implemented with expert parallelism (its formulas assume one sharding group); use "
                         f"offload='none'")


def check_expert_replicas(strategy, model, device) -> None:
    """The experts: equal across the ranks that hold the same ones (the dense parameters are checked over dp)."""
    if expert_parallel(strategy):
        check_replicas_match(model, strategy.ctx.mesh.group("edp"), device, experts=True)


def unit_params(units, expert: bool) -> list:
    """Element counts of the units of one kind (``units``: FlatUnits)."""
    return [u.numel for u in units if u.expert == expert]


def split_experts(specs, expert_parallel: bool) -> list:
    """``(spec, expert)`` per unit to form: each spec as it is, or — with expert parallelism — its dense parameters
    and its experts as two units on the same module (its hooks gather and free both; the experts sharded over
    edp). A part without parameters is left out."""
    if not expert_parallel:
        return [(spec, False) for spec in specs]
    out = []
    for spec in specs:
        for kind in (False, True):
            params = [p for p in spec.params if is_expert(p) == kind]
            if params:
                out.append((spec._replace(params=params, label=f"{spec.label} experts" if kind else spec.label), kind))
    return out


def gather_local(out: torch.Tensor, shard: torch.Tensor, *_args) -> None:
    """A group of one rank: its shard is the whole unit."""
    if out.data_ptr() != shard.data_ptr():
        out.copy_(shard)
    return None


def reduce_local(out: torch.Tensor, flat: torch.Tensor) -> None:
    """A group of one rank: the (already divided) gradients are the reduced shard."""
    if out.data_ptr() != flat.data_ptr():
        out.copy_(flat)
    return None


def group_of(dense: ShardGroup, experts: Optional[ShardGroup], unit) -> ShardGroup:
    return experts if unit.expert else dense
