"""Sharded checkpoints: save at N ranks and stage s, load at M ranks and stage s′, resume exactly.

``save(directory, engine_or_strategy, step=…, data_position=…)`` — every rank writes the
parameters, fp32 masters and optimizer states of its shard, its RNG states, the step and
the data position; rank 0 a manifest with the unit layout and a sha256 per file; the
directory appears atomically (:mod:`.save`, :mod:`.files`).
``load(directory, engine_or_strategy) -> meta`` — verifies, undoes the saved layout into
whole parameters and cuts them into the target's (:mod:`.load`, :mod:`.reshard`, :mod:`.layout`).
``export_full_state_dict(directory)`` — a plain ``{name: tensor}``, no process group needed.
Works for ``ddp``/``ddp-naive``, ``zero1``/``zero2``/``zero3``, ``tp`` and ``pp``, fp32 and
bf16-mixed, behind an engine (``zerokit.initialize``, ``zerokit.train``) or a strategy, on any
mesh dp×tp×pp: each rank writes its tensor-parallel slices and its pipeline stages under the
whole model's names (:mod:`.naming`), and any layout loads any other through the whole state.
``zerokit.train(save_dir=…, save_every=…, resume_from=…)`` saves and resumes runs
(:mod:`.training`); ``export_dcp(directory, out)`` writes the whole state as a
torch.distributed.checkpoint (:mod:`.dcp`).
"""
from .dcp import export_dcp
from .files import CheckpointError
from .load import load
from .naming import Naming
from .reshard import export_full_state_dict
from .save import save

__all__ = ["save", "load", "export_full_state_dict", "export_dcp", "Naming", "CheckpointError"]
