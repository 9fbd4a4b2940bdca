"""``zerokit.train(save_dir=…, save_every=…, resume_from=…)``: checkpoints of a run, and a run that continues one.

Lifecycle:

1. before any process starts, :func:`check_options` takes ``save_dir``, ``save_every`` and
   ``resume_from`` out of the strategy options (where ``--option`` puts them) and checks
   them, each error naming its argument: ``save_every`` is a positive number of steps and
   needs ``save_dir``; ``resume_from`` is a checkpoint directory, or a ``save_dir`` whose
   latest ``step-NNNNNN`` checkpoint is taken; its model (names, full shapes, trainable
   or frozen) is the workload's, its optimizer this run's, and its step is below
   ``steps`` (``steps`` counts from the beginning of the run, so a resumed run ends where
   the uninterrupted one would);
2. on each rank, :class:`Resumable` names the whole model's tensors (:class:`~.naming.Naming`)
   after the tensor-parallel plan and before a pipeline splits it;
3. :meth:`Resumable.resume`, once the strategy exists, loads ``resume_from`` into it in
   this run's layout (any dp×tp×pp, any ZeRO stage) and returns the step to start from
   and the losses of the steps before it, so the report holds the whole run;
4. :meth:`Resumable.after_step` saves to ``save_dir/step-NNNNNN`` after every
   ``save_every``-th step and after the last one, with the step and the mean over the
   ranks of the losses so far as the data position (a workload's ``batch(step)`` is
   a function of the step: the step is where the data stands).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import List, Tuple

import torch

from ..runtime import comm
from .files import MANIFEST, CheckpointError, read_manifest
from .load import load
from .naming import Naming
from .reshard import check_model
from .save import save

STEP_DIR = "step-{:06d}"
_STEP_RE = re.compile(r"^step-(\d+)$")


def latest(directory) -> Path:
    """``directory`` itself when it is a checkpoint, else its ``step-NNNNNN`` checkpoint of the highest step."""
    path = Path(directory)
    if (path / MANIFEST).is_file() or not path.is_dir():
        return path
    steps = sorted((int(m.group(1)), child) for child in path.iterdir()
                   if (m := _STEP_RE.match(child.name)) and (child / MANIFEST).is_file())
    if not steps:
        raise CheckpointError(f"{str(path)!r} holds neither {MANIFEST} nor any step-NNNNNN checkpoint")
    return steps[-1][1]


def _path(value, argument: str):
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ValueError(f"{argument}={value!r} must be a directory path (str or pathlib.Path)")
    return str(value)


def check_options(workload, options: dict, steps, save_dir=None, save_every=None, resume_from=None,
                  optimizer=None):
    """Step 1 of the module docstring; returns (the other options, {"save_dir", "save_every", "resume_from"})."""
    options = dict(options)
    save_dir = _path(options.pop("save_dir", save_dir), "save_dir")
    save_every = options.pop("save_every", save_every)
    resume_from = _path(options.pop("resume_from", resume_from), "resume_from")
    if save_every is not None:
        if isinstance(save_every, bool) or not isinstance(save_every, int) or save_every < 1:
            raise ValueError(f"save_every={save_every!r} must be a positive integer (optimizer steps between "
                             f"checkpoints)")
        if save_dir is None:
            raise ValueError(f"save_every={save_every} needs save_dir=…, the directory the checkpoints go to")
    if save_dir is not None and Path(save_dir).exists() and not Path(save_dir).is_dir():
        raise ValueError(f"save_dir={save_dir!r} exists and is not a directory")
    if resume_from is not None:
        try:
            found = latest(resume_from)
            manifest = read_manifest(found)
            check_model(manifest, Naming(workload.build_model()).params, "the checkpoint")
        except CheckpointError as e:
            raise CheckpointError(f"resume_from={resume_from!r}: {e}") from None
        saved = str(manifest.get("optimizer", ""))
        if isinstance(optimizer, str) and saved.lower() != optimizer.lower():
            raise CheckpointError(f"resume_from={resume_from!r} holds {saved} states; optimizer={optimizer!r} here "
                                  f"(resume with the optimizer it was saved with)")
        step = manifest["step"]
        if not isinstance(step, int) or isinstance(step, bool):
            raise CheckpointError(f"resume_from={resume_from!r}: the checkpoint's step is {step!r}, not a step count")
        if isinstance(steps, int) and step >= steps:
            raise ValueError(f"resume_from={resume_from!r} is at step {step}; steps={steps} must be larger (steps "
                             f"counts from the beginning of the run)")
        resume_from = str(found)
    return options, {"save_dir": save_dir, "save_every": save_every, "resume_from": resume_from}


class Resumable:
    """A rank's checkpointing in ``zerokit.train`` (steps 2-4 of the module docstring)."""

    def __init__(self, job, ctx, model: torch.nn.Module):
        self.job, self.ctx = job, ctx
        self.naming = Naming(model, ctx.mesh.size("tp"))
        self.engine = None

    @classmethod
    def for_job(cls, job, ctx, model):
        """A :class:`Resumable` when the job saves or resumes, else None."""
        wanted = getattr(job, "save_dir", None) is not None or getattr(job, "resume_from", None) is not None
        return cls(job, ctx, model) if wanted else None

    def resume(self, strategy, engine) -> Tuple[int, List[float]]:
        """(the step to start from, the losses before it): (0, []) without ``resume_from``."""
        strategy.checkpoint_naming = self.naming
        self.engine = engine
        if self.job.resume_from is None:
            return 0, []
        meta = load(self.job.resume_from, engine)
        position = meta["data_position"] if isinstance(meta["data_position"], dict) else {}
        step = int(position.get("step", meta["step"]))
        losses = [float(x) for x in position.get("losses", [])]
        if len(losses) != step:  # saved by checkpoint.save in a loop of one's own: the earlier losses are unknown
            losses = [float("nan")] * step
        return step, losses

    def after_step(self, step: int, losses: List[float]) -> None:
        """Save after ``save_every`` steps and after the last one (a collective: every rank calls it)."""
        done, every = step + 1, self.job.save_every
        if self.job.save_dir is None or not ((every and done % every == 0) or done == self.job.steps):
            return
        mean = torch.tensor(losses, dtype=torch.float64, device=self.ctx.device)
        if self.ctx.world_size > 1:
            with comm.phase("setup"):
                comm.all_reduce(mean, tag="checkpoint losses")
            mean /= self.ctx.world_size
        save(Path(self.job.save_dir) / STEP_DIR.format(done), self.engine, step=done,
             data_position={"step": done, "losses": mean.cpu().tolist()})
