"""The device mesh: every rank's place on the named parallel axes ``pp``, ``dp``, ``cp`` and ``tp``.

The world's ranks are laid out as a grid of shape (pp, dp, cp, tp), ``tp`` innermost, as
Megatron and torchtitan do: tensor-parallel neighbours are consecutive ranks (one node,
the fastest links), then context parallelism, data parallelism, pipeline stages
outermost. Rank ``r = ((pp_i · dp + dp_i) · cp + cp_i) · tp + tp_i``. Along each axis a
rank talks to the ranks that share its other coordinates: that set is the axis's process
group. ``dp_cp`` is the flattened dp × cp group (Megatron's data-parallel group "with
context parallel"): the ranks that hold the same weights, over which their gradients are
reduced when the sequence is cut over cp.

Lifecycle: ``parse_parallel`` checks the degrees a user asked for (before any process
starts); on each rank ``Mesh.build`` creates the groups with torch's ``DeviceMesh``
(which works on CPU with gloo); strategies then take their groups from the mesh —
``mesh.group("dp")`` — and never from the world. The communication ledger names the
axis of every collective with ``mesh.axis_of(group)``. A mesh knows the machines too: ``mesh.node``,
``mesh.ranks_per_node`` (:mod:`.nodes`), ``mesh.spans_nodes(axis)`` and ``mesh.node_groups()`` (the
ranks of one node, axis ``node``, and those holding one place on every node, ``inter_node``).

A mesh holds its process groups weakly: torch (``_world``) owns them until
``destroy_process_group``, which then frees them and joins their gloo threads even when a
mesh outlives it — and one does whenever a strategy does, as its parameters' post-accumulate-grad
hooks make it survive ``del engine; gc.collect()``. A held group (torch's DeviceMesh keeps all
it made, the world's too, in ``_pg_registry``) survived ``destroy_process_group`` with its
threads, which then ran into interpreter exit: the setting in which gloo aborts with
"terminate called without an active exception" (pytorch/pytorch#65513, #190489).

Every process group a mesh makes (its axes', the carved ones) or is given (:meth:`Mesh.add_group`) is noted, in
the order made, so that whoever owns the process's group can end them: a launch under torchrun keeps the world
group from call to call, and each call builds its meshes anew, so after each call it destroys what the call's
meshes made (:func:`groups_made`, :func:`destroy_groups_made_since`); without that every ``zerokit.train`` call
left its groups (with ``device_id=``, each an NCCL communicator) in torch's ``_world`` until exit.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from . import nodes as node_layout

AXES = ("pp", "dp", "cp", "tp")
#: what each axis is for, in error messages and tables
AXIS_MEANING = {"dp": "data parallelism (ddp, zero1/2/3)", "tp": "tensor parallelism",
                "pp": "pipeline parallelism", "cp": "context parallelism (the sequence cut over ranks)"}
#: axes some strategy runs on; a degree above 1 on another axis is refused before any process starts
BUILT_AXES = ("dp", "cp", "ep", "tp", "pp")
#: groups made of several axes: name -> the axes, outermost first
FLAT_AXES = {"dp_cp": ("dp", "cp")}
#: groups carved out of dp by the expert-parallel degree ep (DeepSpeed-MoE's and Megatron's convention): ``ep`` the
#: ep consecutive dp ranks that hold different experts, ``edp`` the dp ranks that hold the same experts
EXPERT_AXES = ("ep", "edp")


def parse_parallel(parallel, world_size: int) -> Dict[str, int]:
    """``{"dp": …, "cp": …, "tp": …, "pp": …}`` from a dict (or None: every rank on ``dp``); sizes multiply to the world
    size."""
    if parallel is None:
        return {"pp": 1, "dp": world_size, "tp": 1}
    if not isinstance(parallel, dict):
        raise ValueError(f"parallel={parallel!r} must be a dict of axis degrees, e.g. {{'dp': 2, 'tp': 1, 'pp': 1}}")
    unknown = sorted(set(parallel) - set(AXES) - {"ep"})
    if unknown:
        raise ValueError(f"parallel: unknown axis {', '.join(map(repr, unknown))}; allowed: dp, cp, ep, tp, pp")
    parallel = dict(parallel)
    ep = parallel.pop("ep", 1)
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ValueError(f"parallel: ep={ep!r} must be a positive integer")
    shape = {}
    for axis in AXES:
        value = parallel.get(axis, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"parallel: {axis}={value!r} must be a positive integer")
        shape[axis] = value
    if "dp" not in parallel:  # the data-parallel degree fills the rest, as torchtitan's -1
        rest = shape["cp"] * shape["tp"] * shape["pp"]
        if world_size % rest:
            raise ValueError(f"parallel: cp × tp × pp = {rest} does not divide the world size {world_size}")
        shape["dp"] = world_size // rest
    if math.prod(shape.values()) != world_size:
        raise ValueError(f"parallel: dp × cp × tp × pp = {shape['dp']} × {shape['cp']} × {shape['tp']} × "
                         f"{shape['pp']} = {math.prod(shape.values())}, but the world size is {world_size}; the "
                         f"degrees must multiply to the number of ranks")
    if shape["cp"] == 1:  # the shape names cp only where the sequence is cut: (pp, dp, tp) as before otherwise
        del shape["cp"]
    if ep > 1:  # carved from dp, not a grid axis of its own: the world stays dp × cp × tp × pp
        if shape["dp"] % ep:
            raise ValueError(f"parallel: ep={ep} must divide dp={shape['dp']} (the expert-parallel ranks are carved "
                             f"from the data-parallel ones)")
        shape["ep"] = ep
    return shape


def check_built(shape: Dict[str, int], axes=BUILT_AXES, who: str = "zerokit") -> None:
    """Refuse degrees above 1 on axes outside ``axes``: the parallelisms ``who`` (zerokit, or one strategy) runs."""
    if shape.get("ep", 1) > 1 and "ep" not in axes:
        raise ValueError(f"parallel: ep={shape['ep']} asks for expert parallelism, which {who} does not implement "
                         f"yet; use ep=1 (expert parallelism runs under ddp, zero1, zero2 and zero3)")
    for axis in AXES:
        if axis not in axes and shape.get(axis, 1) > 1:
            allowed = " and ".join(a for a in AXES if a in axes)
            raise ValueError(f"parallel: {axis}={shape[axis]} asks for {AXIS_MEANING[axis]}, which {who} does not "
                             f"implement yet; only {allowed} can be above 1 there (use {axis}=1)")


def _full(shape: Dict[str, int]) -> Dict[str, int]:
    return {axis: shape.get(axis, 1) for axis in AXES}


def coords_of(rank: int, shape: Dict[str, int]) -> Dict[str, int]:
    """A global rank's coordinate on every axis (tp innermost, then cp, dp, pp)."""
    named, shape = shape, _full(shape)
    coords = {}
    for axis in reversed(AXES):
        coords[axis] = rank % shape[axis]
        rank //= shape[axis]
    out = {axis: coords[axis] for axis in AXES if axis in named or axis != "cp"}
    if named.get("ep", 1) > 1:  # the place in its ep group: which experts this rank holds
        out["ep"] = coords["dp"] % named["ep"]
    return out


def rank_of(coords: Dict[str, int], shape: Dict[str, int]) -> int:
    """The global rank at ``coords``."""
    shape, rank = _full(shape), 0
    for axis in AXES:
        rank = rank * shape[axis] + coords.get(axis, 0)
    return rank


def axis_ranks(rank: int, shape: Dict[str, int], axis: str) -> List[int]:
    """The global ranks in ``rank``'s group along ``axis`` (its other coordinates fixed), in axis order; a flat
    group (``dp_cp``) runs its axes outermost first; ``ep`` / ``edp`` are carved from dp."""
    if axis in EXPERT_AXES:
        ep, dp = shape.get("ep", 1), axis_ranks(rank, shape, "dp")
        i = dp.index(rank)
        return dp[i - i % ep:i - i % ep + ep] if axis == "ep" else dp[i % ep::ep]
    mine = coords_of(rank, shape)
    shape = _full(shape)
    axes = FLAT_AXES.get(axis, (axis,))
    out = [dict(mine)]
    for a in axes:
        out = [dict(c, **{a: i}) for c in out for i in range(shape[a])]
    return [rank_of(c, shape) for c in out]


def _weak(group):
    return None if group is None else weakref.ref(group)


#: every process group a mesh made or was given, weakly, in the order made (the world group is never noted)
_made: List[weakref.ref] = []


def _note(*groups) -> None:
    """Note ``groups`` as the meshes' (None, a non-member's placeholder, the world and those noted already are
    skipped)."""
    import torch.distributed as dist

    noted = {id(ref()) for ref in _made if ref() is not None}
    for group in groups:
        if isinstance(group, dist.ProcessGroup) and group is not dist.group.WORLD and id(group) not in noted:
            _made.append(weakref.ref(group))
            noted.add(id(group))


def groups_made() -> int:
    """A mark: how many process groups meshes have made so far (:func:`destroy_groups_made_since` takes it)."""
    return len(_made)


def destroy_groups_made_since(mark: int) -> int:
    """Destroy the process groups meshes made or were given since ``mark`` (:func:`groups_made`), newest first, so
    that every rank destroys them in one order (NCCL's abort was collective in some versions, and torch's own
    ``destroy_process_group`` goes in one order for that); those gone already are skipped. Call it on every rank
    once the groups' collectives are over (this rank's CUDA device, where one is in use, is synchronized first, so
    that nothing queued on them still runs). Returns how many it destroyed."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    mine, _made[mark:] = _made[mark:], []
    live = [group for group in (ref() for ref in mine) if group is not None and group in c10d._world.pg_map]
    if live and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    for group in reversed(live):
        dist.destroy_process_group(group)
    return len(live)


def _alive(ref, axis: str):
    if ref is None:
        return None
    group = ref()
    if group is None:
        raise RuntimeError(f"the process group of mesh axis {axis!r} was destroyed (destroy_process_group); a new "
                           f"process group needs a new mesh")
    return group


def _weak_registry(device_mesh) -> None:
    """Let torch's DeviceMesh hold its groups weakly too: its ``_pg_registry`` (read only while torch.compile
    traces, and by pickling) otherwise keeps every group it made alive, the world's included."""
    registry = getattr(device_mesh, "_pg_registry", None)
    if isinstance(registry, dict):
        device_mesh._pg_registry = weakref.WeakValueDictionary(registry)


@dataclass
class Mesh:
    """One rank's view of the grid: the shape, its coordinates, and a process group per axis (held weakly: see
    the module docstring)."""

    shape: Dict[str, int]
    rank: int
    #: axis -> process group (None: the world group, or no process group in a world of one); stored as weak
    #: references, read through :meth:`group`
    groups: Dict[str, object] = field(default_factory=dict)
    device_mesh: Optional[object] = None
    #: further groups within one axis (a pipeline's tied-weight group): (group, axis) pairs, the group weakly
    subgroups: List[tuple] = field(default_factory=list)
    #: axes carved out of one axis by :meth:`carve`: name -> (axis, inner size, "inner" or "outer")
    carved: Dict[str, tuple] = field(default_factory=dict)

    def __post_init__(self):
        self.groups = {axis: _weak(group) for axis, group in self.groups.items()}
        self.subgroups = [(_weak(group), axis) for group, axis in self.subgroups]
        if self.device_mesh is not None:
            _weak_registry(self.device_mesh)

    @classmethod
    def build(cls, rank: int, world_size: int, device_type: str = "cpu", parallel=None) -> "Mesh":
        shape = parse_parallel(parallel, world_size)
        import torch.distributed as dist

        if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return cls(shape, rank, {axis: None for axis in (*AXES, *FLAT_AXES)})
        from torch.distributed.device_mesh import init_device_mesh

        full = _full(shape)
        mesh = init_device_mesh(device_type, tuple(full[a] for a in AXES), mesh_dim_names=AXES)
        groups = {axis: (None if full[axis] == world_size else mesh.get_group(axis)) for axis in AXES}
        for flat, axes in FLAT_AXES.items():
            if all(full[a] == 1 for a in axes if a != "dp"):
                groups[flat] = groups["dp"]  # cp = 1: the data-parallel group itself
            else:  # its own group object, world-sized or not, so the ledger names its traffic dp_cp
                groups[flat] = mesh[axes]._flatten(flat).get_group()
        if shape.get("ep", 1) > 1:  # every rank makes every group, in one order (torch's new_group rule)
            for axis in EXPERT_AXES:
                made = {}
                for r in range(world_size):
                    members = tuple(axis_ranks(r, shape, axis))
                    if members not in made:
                        made[members] = dist.new_group(list(members))
                groups[axis] = made[tuple(axis_ranks(rank, shape, axis))]
        else:
            groups.update({"ep": None, "edp": groups["dp"]})
        # every axis's group as torch's mesh holds it: a world-sized axis's is the world (not noted) or, with CUDA at
        # hand on a gloo world, a group torch made for it
        _note(*(mesh.get_group(axis) for axis in AXES), *groups.values())
        return cls(shape, rank, groups, mesh)

    def carve(self, inner: int, axis: str = "dp", names=("dp_shard", "dp_replicate")):
        """Cut ``axis`` into groups of ``inner`` consecutive ranks (``names[0]``) and the ranks holding the same
        place in each (``names[1]``): HSDP's shard and replicate groups (torchtitan's ``dp_shard`` and
        ``dp_replicate``, FSDP2's 2-D mesh (replicate, shard)), hpZ's secondary partition. Collective: every
        rank of the world calls it, in one order (torch's ``new_group`` rule); a second call with the same
        ``inner`` returns the groups made by the first. Returns (inner group, outer group); both None without a
        process group of several ranks."""
        size = self.size(axis)
        if isinstance(inner, bool) or not isinstance(inner, int) or inner < 1 or size % inner:
            raise ValueError(f"shard group size {inner!r} must be a whole number dividing the {size} ranks of "
                             f"axis {axis!r}")
        made = self.carved.get(names[0])
        if made is not None:
            if made[:2] != (axis, inner):
                raise ValueError(f"axis {names[0]!r} was carved from {made[0]!r} in groups of {made[1]} already; "
                                 f"a second size ({inner}) needs other names")
            return self.group(names[0]), self.group(names[1])
        self.carved.update({names[0]: (axis, inner, "inner"), names[1]: (axis, inner, "outer")})
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            self.groups.update({names[0]: None, names[1]: None})
            return None, None
        world = dist.get_world_size()
        for name in names:
            made = {}
            for r in range(world):  # every rank makes every group, in one order
                members = tuple(self._carved_ranks(r, name))
                if members not in made:
                    made[members] = dist.new_group(list(members))
            _note(*made.values())
            self.groups[name] = _weak(made[tuple(self._carved_ranks(self.rank, name))])
        return self.group(names[0]), self.group(names[1])

    def _carved_ranks(self, rank: int, name: str) -> List[int]:
        axis, inner, which = self.carved[name]
        members = list(range(self.size("world"))) if axis == "world" else axis_ranks(rank, self.shape, axis)
        i = members.index(rank)
        return members[i - i % inner:i - i % inner + inner] if which == "inner" else members[i % inner::inner]

    @property
    def coords(self) -> Dict[str, int]:
        return coords_of(self.rank, self.shape)

    def size(self, axis: str) -> int:
        if axis == "world":  # every rank (ep is carved from dp, not a factor of the world)
            return math.prod(self.shape.get(a, 1) for a in AXES)
        if axis in self.carved:
            base, inner, which = self.carved[axis]
            return inner if which == "inner" else self.size(base) // inner
        if axis in EXPERT_AXES:
            ep = self.shape.get("ep", 1)
            return ep if axis == "ep" else self.shape["dp"] // ep
        return math.prod(self.shape.get(a, 1) for a in FLAT_AXES.get(axis, (axis,)))

    def coord(self, axis: str) -> int:
        if axis in EXPERT_AXES or axis in self.carved:
            return self.ranks(axis).index(self.rank)
        coords, index = self.coords, 0
        for a in FLAT_AXES.get(axis, (axis,)):
            index = index * self.shape.get(a, 1) + coords.get(a, 0)
        return index

    def group(self, axis: str):
        """The process group along ``axis`` (None: the world, when the axis spans every rank)."""
        if axis not in AXES and axis not in FLAT_AXES and axis not in EXPERT_AXES and axis not in self.carved:
            raise ValueError(f"axis={axis!r}; allowed: {', '.join((*AXES, *FLAT_AXES, *EXPERT_AXES, *self.carved))}")
        return _alive(self.groups.get(axis), axis)

    def ranks(self, axis: str) -> List[int]:
        if axis == "world":
            return list(range(self.size("world")))
        if axis in self.carved:
            return self._carved_ranks(self.rank, axis)
        return axis_ranks(self.rank, self.shape, axis)

    @property
    def ranks_per_node(self) -> int:
        """Ranks on each node (:func:`zerokit.runtime.nodes.ranks_per_node`: torchrun's, or the launcher's emulated
        nodes; one node without either)."""
        return node_layout.ranks_per_node(self.size("world"))

    @property
    def node(self) -> int:
        """The node this rank is on (torchrun's ``GROUP_RANK``: ranks are numbered node by node)."""
        return self.rank // self.ranks_per_node

    @property
    def nodes(self) -> int:
        return self.size("world") // self.ranks_per_node

    def spans_nodes(self, axis: str) -> bool:
        """Whether this rank's group along ``axis`` has ranks on more than one node (its traffic leaves the node)."""
        return node_layout.spans_nodes(self.ranks(axis), self.ranks_per_node)

    def node_groups(self):
        """(intra-node group, inter-node group): the ranks of this rank's node (axis ``node``), and the ranks holding
        its place on every node (axis ``inter_node``, one per local rank) — :meth:`carve` of the world by
        :attr:`ranks_per_node`. Collective, as :meth:`carve` is."""
        return self.carve(self.ranks_per_node, axis="world", names=("node", "inter_node"))

    def add_group(self, group, axis: str) -> None:
        """Name the axis of a group made within one (the ledger then counts its traffic there); the group is the
        mesh's from then on (:func:`destroy_groups_made_since` ends it with the mesh's own)."""
        _note(group)
        self.subgroups.append((_weak(group), axis))

    def axis_of(self, group) -> str:
        """The axis a process group belongs to; "world" for the world group when no single axis spans it."""
        for sub, axis in self.subgroups:
            if group is not None and sub is not None and sub() is group:
                return axis
        for axis in AXES:
            held = self.groups.get(axis)
            if (held() if held is not None else None) is group and (group is not None or self.size(axis) > 1):
                return axis
        for axis in (*self.carved, *FLAT_AXES, *EXPERT_AXES):
            held = self.groups.get(axis)
            if group is not None and held is not None and held() is group:
                return axis
        return "world"
