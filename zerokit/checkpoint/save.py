"""``zerokit.checkpoint.save``: every rank writes its shard, rank 0 the manifest, and the directory appears whole.

Lifecycle of ``save(directory, engine_or_strategy, step=…, data_position=…)`` (a collective:
every rank of the world — every dp, tp and pp coordinate — calls it, between optimizer steps):

1. rank 0 draws a token and broadcasts it; the ranks agree on the temporary directory
   ``.D.tmp-<token>`` next to ``D`` (:mod:`.files`), which rank 0 creates (removing the
   leftovers of a crashed save first); a barrier;
2. each rank writes ``shard-r-of-N.pt`` (r its global rank): the segments it holds
   (:func:`~.layout.local_state`: parameters — its tensor-parallel slices, its pipeline
   stages' — fp32 masters, optimizer states), its RNG states (CPU, CUDA when present,
   Python's ``random``), the step and the data position; dp rank 0 of each (pp, tp)
   replica adds the frozen parameters and the buffers; the ranks' layouts, under the
   whole model's names (:mod:`.naming`), are gathered on rank 0; a barrier;
3. rank 0 hashes the files, writes ``manifest.json`` (world size, mesh, stage, strategy,
   dtype, optimizer, every parameter's full shape, tensor-parallel cut and trainability,
   the tied aliases, each replica's unit layout, sha256 per file) and renames the
   directory into place; a last barrier, so that ``save`` returns once ``D`` exists.

A failure before step 3's rename leaves any previous ``D`` untouched. The barriers run in
the ``setup`` phase, so the training ledger does not count them.
"""
from __future__ import annotations

import random
import secrets
from pathlib import Path

import torch

import torch.distributed as dist

from ..runtime import comm
from . import files
from .layout import local_state, optimizer_name, segments
from .naming import full_shape, naming_of, persistent_buffers, spec_of


def strategy_of(obj):
    """The strategy behind an engine (``zerokit.initialize``, ``zerokit.train``) or the strategy itself."""
    if isinstance(obj, torch.nn.Module) and hasattr(obj, "strategy"):
        raise TypeError(f"zerokit.checkpoint: {type(obj).__name__} is stepped by your own torch optimizer, whose "
                        f"states zerokit does not hold; checkpoint an engine from zerokit.initialize, or save "
                        f"model.state_dict() and optimizer.state_dict() with torch.save")
    if isinstance(obj, torch.nn.Module) and getattr(obj, "_zerokit_face", None) is not None:  # zerokit.fully_shard
        raise TypeError("zerokit.checkpoint: a fully_shard model is stepped by your own optimizer, whose states are "
                        "this rank's shards; save model.full_state_dict() (whole, on rank 0) with torch.save, and "
                        "each rank's optimizer.state_dict() beside it (the same layout reloads it); or train through "
                        "zerokit.initialize, whose engine zerokit.checkpoint saves in any layout")
    if hasattr(obj, "consolidate_state_dict") and hasattr(obj, "strategies"):  # zerokit.ShardedOptimizer
        raise TypeError("zerokit.checkpoint: a ShardedOptimizer knows its parameters by position, not by the model's "
                        "names; save it as torch's ZeroRedundancyOptimizer is saved: optimizer.consolidate_state_dict"
                        "(to=0) on every rank, then on rank 0 torch.save({'model': model.state_dict(), 'optimizer': "
                        "optimizer.state_dict()}, path); or train through zerokit.initialize, whose engine "
                        "zerokit.checkpoint saves in any layout")
    strategy = getattr(obj, "strategy", obj)
    if not hasattr(strategy, "model") or not hasattr(strategy, "stage"):
        raise TypeError(f"zerokit.checkpoint: expected a zerokit Engine or strategy, got {type(obj).__name__}")
    return strategy


def _world(strategy):
    return strategy.ctx.rank, strategy.ctx.world_size


def barrier(strategy) -> None:
    """Every rank of the world (dp, tp and pp), in the setup phase: returns once every rank has arrived.

    An all-reduce of one element cannot complete before every rank has contributed. On gloo the call returns
    when it completes; on NCCL it returns once enqueued, so the host then waits for the device
    (``torch.cuda.synchronize``) — without it a rank could write its shard before rank 0 made the directory, and
    ``save`` return before the manifest is committed."""
    if _world(strategy)[1] > 1:
        device = strategy.ctx.device
        with comm.phase("setup"):
            comm.all_reduce(torch.zeros(1, device=device), tag="checkpoint barrier")
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def _token(strategy) -> str:
    rank, world = _world(strategy)
    t = torch.tensor([secrets.randbits(62) if rank == 0 else 0], dtype=torch.int64, device=strategy.ctx.device)
    if world > 1:
        with comm.phase("setup"):
            comm.broadcast(t, src=0, tag="checkpoint token")
    return f"{int(t.item()):016x}"


def rng_state() -> dict:
    state = {"cpu": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _replica(strategy, naming) -> dict:
    """This rank's (pp, tp) replica: its saved layout under global names, and its parameters' whole-model table."""
    mesh = strategy.ctx.mesh
    tp = mesh.size("tp")
    params = {}
    for local, p in strategy.model.named_parameters():
        spec = spec_of(p)
        params[naming.name(p, local)] = {"shape": full_shape(p.shape, spec, tp), "shard": spec,
                                         "trainable": bool(p.requires_grad)}
    return {"pp": mesh.coord("pp"), "tp": mesh.coord("tp"), "dp": mesh.coord("dp"),
            "segments": segments(strategy, naming.name), "params": params}


def _check_json(value, what: str):
    import json

    try:
        json.dumps(value)
    except TypeError as e:
        raise ValueError(f"zerokit.checkpoint.save({what}={value!r}): must be JSON-serializable (numbers, strings, "
                         f"lists, dicts): {e}") from None


def save(directory, engine_or_strategy, step=None, data_position=None) -> Path:
    """Write a sharded checkpoint of ``engine_or_strategy`` to ``directory`` (see the module docstring)."""
    strategy = strategy_of(engine_or_strategy)
    engine = engine_or_strategy if engine_or_strategy is not strategy else None
    if engine is not None and getattr(engine, "micro_steps", 0):
        raise ValueError(f"zerokit.checkpoint.save: {engine.micro_steps} micro-batches of the current step are "
                         f"accumulated; save between optimizer steps (after engine.step())")
    if step is None:
        step = getattr(engine, "global_steps", 0)
    _check_json(step, "step")
    _check_json(data_position, "data_position")
    naming = naming_of(strategy)
    final = Path(directory).absolute()
    rank, world = _world(strategy)
    tmp = files.temporary(final, _token(strategy))
    if rank == 0:
        final.parent.mkdir(parents=True, exist_ok=True)
        files.remove_stale(final)
        tmp.mkdir()
    barrier(strategy)
    payload = {"rank": rank, "world_size": world, "coords": strategy.ctx.mesh.coords, "step": step,
               "data_position": data_position, "segments": local_state(strategy), "rng": rng_state()}
    model = strategy.model
    if strategy.rank == 0:  # dp rank 0 of each (pp, tp) replica: what every dp rank holds the same
        payload["frozen"] = {naming.name(p, n): p.detach().cpu().clone() for n, p in model.named_parameters()
                             if not p.requires_grad}
        payload["buffers"] = {naming.name(b, n): b.detach().cpu().clone() for n, b in persistent_buffers(model)}
    files.write_file(tmp / files.shard_name(rank, world), payload)
    replicas = [None] * world
    mine = _replica(strategy, naming)
    if world > 1:
        dist.all_gather_object(replicas, mine)
    else:
        replicas = [mine]
    barrier(strategy)
    if rank == 0:
        params = {}
        for replica in replicas:
            params.update(replica.pop("params"))
        dtype = strategy.optimizer.tensors[0].dtype
        manifest = {"format": files.FORMAT, "version": files.VERSION, "world_size": world,
                    "mesh": dict(strategy.ctx.mesh.shape), "stage": strategy.stage, "strategy": strategy.name,
                    "dtype": str(dtype).replace("torch.", ""), "optimizer": optimizer_name(strategy),
                    "step": step, "data_position": data_position,
                    "params": {n: params[n] for n in naming.params if n in params},
                    "tied": dict(naming.tied),
                    "replicas": [{k: r[k] for k in ("pp", "tp", "segments")} for r in replicas if r["dp"] == 0],
                    "files": {files.shard_name(r, world): None for r in range(world)}}
        files.commit(tmp, final, manifest)
    barrier(strategy)
    return final
