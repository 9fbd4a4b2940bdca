"""``zerokit.checkpoint.load``: any checkpoint into any strategy, at any world size; the run resumes exactly.

Lifecycle of ``load(directory, engine_or_strategy) -> meta`` (a collective in spirit: every
rank calls it, each reads the files on its own; no communication):

1. the manifest is read and checked (:mod:`.files`), then compared with the whole model
   (:mod:`.naming`) — global names, full shapes, trainable or frozen — naming the first
   parameter that differs (:func:`~.reshard.check_model`), and the optimizer class must
   be the saved one;
2. every shard file is verified (sha256) and loaded with ``weights_only=True``, and the
   saved layout (dp×tp×pp, ZeRO stage) is undone into every parameter whole
   (:func:`~.reshard.full_state`);
3. this rank's slices are cut from it (:func:`~.naming.localize`: its pipeline stages,
   its tensor-parallel slice) and its data-parallel layout filled
   (:func:`~.layout.apply_full`): parameters, fp32 masters, optimizer states; gradients
   are zeroed;
4. global rank r takes back the RNG states saved by rank r (a rank beyond the saved
   world size keeps its own; each visible GPU the state saved for its index, with a
   warning when the saving job saw another GPU count: :func:`restore_cuda_rng`), and an
   engine's step counter is set to the saved step.

Returns ``{"step", "data_position", "world_size", "mesh", "stage", "strategy"}`` of the checkpoint.
"""
from __future__ import annotations

import random
import warnings

import torch

from .files import CheckpointError, read_manifest, shard_name
from .layout import apply_full, optimizer_name
from .naming import localize, naming_of
from .reshard import check_model, full_state
from .save import strategy_of


def _restore_rng(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        restore_cuda_rng(state["cuda"])


def restore_cuda_rng(saved: list) -> None:
    """Give each visible GPU back the RNG state saved for the GPU of its index (``torch.cuda.get_rng_state_all``'s
    order). A job saved with another GPU count restores the devices both have, and says which keep their own:
    ``torch.cuda.set_rng_state_all`` would fail on a device that is not here (or silently skip the ones it lacks)."""
    here = torch.cuda.device_count()
    for index, state in enumerate(saved[:here]):
        torch.cuda.set_rng_state(state, index)
    if len(saved) != here:
        kept = f"; cuda:{len(saved)}…cuda:{here - 1} keep their own" if here > len(saved) else ""
        warnings.warn(f"zerokit.checkpoint.load: the checkpoint holds the RNG states of {len(saved)} GPU(s), this "
                      f"process sees {here}: restored cuda:0…cuda:{min(len(saved), here) - 1}{kept}; random "
                      f"streams on the GPU (dropout) continue as the saving run's only on those", stacklevel=3)


def load(directory, engine_or_strategy) -> dict:
    """Load the checkpoint in ``directory`` into ``engine_or_strategy`` (see the module docstring)."""
    strategy = strategy_of(engine_or_strategy)
    engine = engine_or_strategy if engine_or_strategy is not strategy else None
    naming = naming_of(strategy)
    manifest = read_manifest(directory)
    where = f"checkpoint {str(directory)!r}"
    check_model(manifest, naming.params, where)
    mine = optimizer_name(strategy)
    if manifest["optimizer"] != mine:
        raise CheckpointError(f"{where} holds {manifest['optimizer']} states; this run's optimizer is {mine}")
    full, manifest, shards = full_state(directory, manifest)
    apply_full(strategy, localize(full, strategy, naming))
    strategy.zero_grad()
    rank = strategy.ctx.rank
    if rank < manifest["world_size"]:
        rng = shards[rank].get("rng")
        if rng is None:
            raise CheckpointError(f"{shard_name(rank, manifest['world_size'])} holds no RNG state")
        _restore_rng(rng)
    if engine is not None and hasattr(engine, "global_steps"):
        engine.global_steps = int(manifest["step"]) if isinstance(manifest["step"], int) else engine.global_steps
        engine.micro_steps = 0
    return {k: manifest[k] for k in ("step", "data_position", "world_size", "mesh", "stage", "strategy")}
