"""``export_dcp(checkpoint, out)``: any zerokit checkpoint as a torch.distributed.checkpoint (DCP) directory.

Lifecycle: :func:`~.reshard.export_full_state_dict` undoes the saved layout (dp×tp×pp, ZeRO
stage) into the whole model's tensors; ``torch.distributed.checkpoint.save`` then writes
them with ``no_dist=True`` (no process group needed) as ``{"model": {name: tensor}}`` and,
with ``optimizer_states=True``, ``{"optim": {name: {key: tensor}}}``, plus ``{"step": …}``.
The result reads back with ``dcp.load`` into a torch run of any layout (DCP reshards on
load), or into one file with ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``.
It is the whole state written by one process, not DCP's own per-rank sharded save:
a bridge to torch's tools, not a second checkpoint format for zerokit's runs.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from .files import read_manifest
from .reshard import export_full_state_dict


def export_dcp(checkpoint, out, optimizer_states: bool = False) -> Path:
    """Write the whole state of the zerokit checkpoint ``checkpoint`` as a DCP checkpoint in ``out``."""
    import torch.distributed.checkpoint as dcp

    manifest = read_manifest(checkpoint)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"export_dcp: out={str(out)!r} exists and is not empty; give a new directory")
    out.mkdir(parents=True, exist_ok=True)
    exported = export_full_state_dict(checkpoint, optimizer_states=optimizer_states)
    model, optim = exported if optimizer_states else (exported, None)
    tied = manifest.get("tied", {})
    # one entry per tensor: DCP writes every key, and a tied alias would be written twice
    state = {"model": {k: v.contiguous() for k, v in model.items() if k not in tied},
             "step": manifest["step"] if isinstance(manifest["step"], int) else 0}
    if optim is not None:
        state["optim"] = {name: {k: v.contiguous() for k, v in s.items()} for name, s in optim.items()}
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.save(state, checkpoint_id=str(out), no_dist=True)
    return out
