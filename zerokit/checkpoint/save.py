"""``zerokit.checkpoint.save``: every rank writes its shard, rank 0 the manifest, and the directory appears whole.

Lifecycle of ``save(directory, engine_or_strategy, step=…, data_position=…)`` (a collective:
every rank of the data-parallel group calls it, between optimizer steps):

1. rank 0 draws a token and broadcasts it; the ranks agree on the temporary directory
   ``.D.tmp-<token>`` next to ``D`` (:mod:`.files`), which rank 0 creates (removing the
   leftovers of a crashed save first); a barrier;
2. each rank writes ``shard-r-of-N.pt``: the segments it holds (:func:`~.layout.local_state`:
   parameters, fp32 masters, optimizer states), its RNG states (CPU, CUDA when present,
   Python's ``random``), the step and the data position; rank 0 adds the frozen
   parameters and the buffers (whole on every rank); a barrier;
3. rank 0 hashes the files, writes ``manifest.json`` (world size, stage, strategy, dtype,
   optimizer, unit layout, frozen parameters, sha256 per file) and renames the directory
   into place; a last barrier, so that ``save`` returns on every rank once ``D`` exists.

A failure before step 3's rename leaves any previous ``D`` untouched. The barriers run in
the ``setup`` phase, so the training ledger does not count them.
"""
from __future__ import annotations

import random
import secrets
from pathlib import Path

import torch

from ..runtime import comm
from . import files
from .layout import local_state, optimizer_name, segments


def strategy_of(obj):
    """The strategy behind an engine (``zerokit.initialize``, ``zerokit.train``) or the strategy itself."""
    if isinstance(obj, torch.nn.Module) and hasattr(obj, "strategy"):
        raise TypeError(f"zerokit.checkpoint: {type(obj).__name__} is stepped by your own torch optimizer, whose "
                        f"states zerokit does not hold; checkpoint an engine from zerokit.initialize, or save "
                        f"model.state_dict() and optimizer.state_dict() with torch.save")
    strategy = getattr(obj, "strategy", obj)
    if not hasattr(strategy, "model") or not hasattr(strategy, "stage"):
        raise TypeError(f"zerokit.checkpoint: expected a zerokit Engine or strategy, got {type(obj).__name__}")
    other = {a: n for a, n in getattr(strategy.ctx.mesh, "shape", {}).items() if a != "dp" and n > 1}
    if other:
        raise ValueError(f"zerokit.checkpoint: the mesh has {other} besides data parallelism; sharded checkpoints "
                         f"cover data parallelism and ZeRO (dp only) so far")
    return strategy


def barrier(strategy) -> None:
    if strategy.world > 1:
        with comm.phase("setup"):
            comm.all_reduce(torch.zeros(1, device=strategy.ctx.device), group=strategy.group, tag="checkpoint barrier")


def _token(strategy) -> str:
    t = torch.tensor([secrets.randbits(62) if strategy.rank == 0 else 0], dtype=torch.int64,
                     device=strategy.ctx.device)
    if strategy.world > 1:
        with comm.phase("setup"):
            comm.broadcast(t, src=0, group=strategy.group, tag="checkpoint token")
    return f"{int(t.item()):016x}"


def rng_state() -> dict:
    state = {"cpu": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def tied_names(model) -> dict:
    """{alias: name} of parameters shared by several modules (``named_parameters`` lists each once)."""
    canonical = {p: n for n, p in model.named_parameters()}
    return {n: canonical[p] for n, p in model.named_parameters(remove_duplicate=False) if canonical[p] != n}


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
    final = Path(directory).absolute()
    rank, world = strategy.rank, strategy.world
    tmp = files.temporary(final, _token(strategy))
    if rank == 0:
        final.parent.mkdir(parents=True, exist_ok=True)
        files.remove_stale(final)
        tmp.mkdir()
    barrier(strategy)
    payload = {"rank": rank, "world_size": world, "step": step, "data_position": data_position,
               "segments": local_state(strategy), "rng": rng_state()}
    model = strategy.model
    if rank == 0:
        payload["frozen"] = {n: p.detach().cpu().clone() for n, p in model.named_parameters() if not p.requires_grad}
        payload["buffers"] = {n: b.detach().cpu().clone() for n, b in model.named_buffers()}
    files.write_file(tmp / files.shard_name(rank, world), payload)
    barrier(strategy)
    if rank == 0:
        dtype = strategy.optimizer.tensors[0].dtype
        manifest = {"format": files.FORMAT, "version": files.VERSION, "world_size": world,
                    "stage": strategy.stage, "strategy": strategy.name, "dtype": str(dtype).replace("torch.", ""),
                    "optimizer": optimizer_name(strategy), "step": step, "data_position": data_position,
                    "segments": segments(strategy),
                    "frozen": {n: list(p.shape) for n, p in model.named_parameters() if not p.requires_grad},
                    "tied": tied_names(model),
                    "files": {files.shard_name(r, world): None for r in range(world)}}
        files.commit(tmp, final, manifest)
    barrier(strategy)
    return final
