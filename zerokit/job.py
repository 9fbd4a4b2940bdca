"""The job: every argument of ``zerokit.train`` checked and packed, before any process starts.

``make_job`` validates the workload, the strategy and its options, the precision, steps,
micro-batches and batch divisibility, the mesh (``parallel``) against the axes the
strategy runs on, the tensor-parallel plan, the pipeline's options and the
checkpointing policy against the model — each with an error naming the argument — and
returns the :class:`Job` that is pickled to every rank (:func:`zerokit.train.run_rank`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from . import theory
from .optim import OptimizerSpec
from .pipeline_parallel.options import check_pipeline
from .runtime.mesh import check_built, parse_parallel
from .strategies import TrainConfig, get as get_strategy
from .workloads import Workload


@dataclass
class Job:
    """Everything a rank needs to train; pickled to each rank."""

    workload: Workload
    strategy: str
    steps: int
    config: TrainConfig
    options: Dict[str, Any] = field(default_factory=dict)
    #: sample memory at every module and gradient (peak); off for timing runs
    track_peak: bool = True
    #: return every communication record and compute span (for timelines)
    keep_records: bool = False
    #: the device mesh: {"dp": …, "tp": …, "pp": …} (None: every rank on dp)
    parallel: Optional[Dict[str, int]] = None
    #: with tp > 1: shard LayerNorm/dropout regions along the sequence (Korthikanti et al.)
    sequence_parallel: bool = False
    #: activation checkpointing policy on the model's repeated blocks (:mod:`zerokit.checkpointing`)
    checkpointing: str = "none"
    #: blocks per segment for ``checkpointing="every_k"``
    checkpoint_every: Optional[int] = None
    #: the emulated link every rank's collectives complete through (:mod:`zerokit.runtime.link`); None: none
    link: Optional[Any] = None
    #: sharded checkpoints (:mod:`zerokit.checkpoint.training`): where, every how many steps, and where from
    save_dir: Optional[str] = None
    save_every: Optional[int] = None
    resume_from: Optional[str] = None
    #: with cp > 1: the attention across the cp ranks, "ring" or "ulysses" (:mod:`zerokit.context_parallel`)
    cp_attention: str = "ring"


def make_job(workload: Workload, strategy: str, world_size: int, steps: int, precision: str,
             optimizer: str, lr: float, micro_batches: int, options: dict, track_peak: bool = True,
             keep_records: bool = False, parallel: Optional[Dict[str, int]] = None,
             sequence_parallel: bool = False, checkpointing: str = "none",
             checkpoint_every: Optional[int] = None, link=None, save_dir=None, save_every=None,
             resume_from=None) -> Job:
    """Check every argument and build the job, before any process starts."""
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a zerokit.Workload, got {type(workload).__name__}")
    cls = get_strategy(strategy)
    options, checkpointing, checkpoint_every = _checkpointing_options(workload, options, checkpointing,
                                                                      checkpoint_every)
    from .runtime.link import resolve as resolve_link

    link = resolve_link(options.pop("link", link))  # --option link=… puts it in the options
    cp_attention = options.pop("cp_attention", None)
    theory.check_precision(precision)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a positive integer")
    from .checkpoint.training import check_options as check_saving

    options, saving = check_saving(workload, options, steps, save_dir, save_every, resume_from, optimizer)
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r} must be a positive integer")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be a positive integer")
    if cls.name == "single" and world_size != 1:
        raise ValueError(f"strategy 'single' runs in one process; world_size must be 1, got {world_size}")
    if sequence_parallel is True and cls.own_tensor_parallel and "sequence_parallel" in cls.options:
        options = {**options, "sequence_parallel": True}  # a peer that shards over tp itself takes it as an option
    cls.resolve_options(options)
    pipeline_only = getattr(cls, "pipeline_only", False)
    if pipeline_only and parallel is None:
        parallel = {"pp": world_size}
    shape = parse_parallel(parallel, world_size)
    if shape["pp"] > 1 and cls.pipeline_refusal:
        raise ValueError(f"strategy {cls.name!r} with parallel pp={shape['pp']}: {cls.pipeline_refusal}")
    check_built(shape, cls.axes, f"strategy {cls.name!r}")
    if "pp" in cls.axes:
        pipeline = pipeline_only or shape["pp"] > 1
        check_pipeline(options, micro_batches, shape["pp"], cls.name, workload.build_model() if pipeline else None,
                       pipeline_only)
    _check_tensor_parallel(workload, cls, shape["tp"], sequence_parallel)
    if cls.name == "single":  # the one-process reference a comparison runs the same options against: no cp
        cp_attention = None
    cp_attention = _check_context_parallel(workload, shape, cp_attention, sequence_parallel)
    if shape.get("ep", 1) > 1:
        from .expert_parallel.apply import check_model as check_experts

        if shape.get("cp", 1) > 1 or shape["pp"] > 1:
            raise ValueError(f"parallel ep={shape['ep']} with cp={shape.get('cp', 1)}, pp={shape['pp']}: expert "
                             f"parallelism composes with dp and tp only so far; use cp=1, pp=1")
        check_experts(workload.build_model(), shape["ep"])
    spec = OptimizerSpec(name=optimizer, lr=lr)
    batch = workload.batch_size
    degree = shape["dp"] if cls.data_parallel else 1
    if batch % (degree * micro_batches):
        raise ValueError(f"the workload's global batch of {batch} is not divisible by the data-parallel degree "
                         f"({degree}) times micro_batches ({micro_batches}); choose a batch size that is a "
                         f"multiple of {degree * micro_batches}")
    return Job(workload, strategy, steps, TrainConfig(precision, spec, micro_batches), dict(options),
               track_peak, keep_records, None if parallel is None else shape, sequence_parallel,
               checkpointing=checkpointing, checkpoint_every=checkpoint_every, link=link, **saving,
               cp_attention=cp_attention)


def _check_context_parallel(workload: Workload, shape: Dict[str, int], attention, sequence_parallel: bool) -> str:
    """``cp_attention`` and the model under cp > 1, before any process starts; a cp_attention without cp is refused
    (it would change nothing)."""
    cp = shape.get("cp", 1)
    if cp == 1:
        if attention is not None:
            raise ValueError(f"cp_attention={attention!r} applies only with context parallelism: add cp=2 (or more) "
                             f"to parallel")
        return "ring"
    from .context_parallel.apply import check_model

    attention = "ring" if attention is None else attention
    if shape["pp"] > 1:
        raise ValueError(f"parallel cp={cp} with pp={shape['pp']}: context parallelism composes with dp and tp only "
                         f"so far; use pp=1")
    if sequence_parallel:
        raise ValueError(f"sequence_parallel=True with cp={cp}: the sequence is already cut over cp; zerokit does "
                         f"not cut it again over tp (use sequence_parallel=False)")
    model = workload.build_model()
    seq_len = workload.batch(0)[0].shape[1]
    check_model(model, seq_len, cp, attention, tp=shape["tp"])
    return attention


#: keywords of ``train`` that ``--option`` / ``options_for`` may also carry, for every strategy
JOB_OPTIONS = ("checkpointing", "checkpoint_every", "link", "save_dir", "save_every", "resume_from", "cp_attention")


def _checkpointing_options(workload: Workload, options: dict, checkpointing, checkpoint_every):
    """Take ``checkpointing``/``checkpoint_every`` out of ``options`` (where the CLI puts them) and check them
    against the workload's model before any process starts; returns (options, policy, every)."""
    options = dict(options)
    checkpointing = options.pop("checkpointing", checkpointing)
    checkpoint_every = options.pop("checkpoint_every", checkpoint_every)
    from .checkpointing import check_for_model, check_policy

    check_policy(checkpointing, checkpoint_every)
    if checkpointing != "none":
        check_for_model(workload.build_model(), checkpointing, checkpoint_every)
    return options, checkpointing, checkpoint_every


def _check_tensor_parallel(workload: Workload, cls, tp: int, sequence_parallel) -> None:
    """The workload's plan against the model and the degree, before any process starts."""
    if not isinstance(sequence_parallel, bool):
        raise ValueError(f"sequence_parallel={sequence_parallel!r} must be True or False")
    if tp == 1 or cls.own_tensor_parallel:
        if sequence_parallel and tp == 1:
            raise ValueError("sequence_parallel=True needs tensor parallelism: a tp degree above 1 in parallel")
        return
    if workload.tensor_parallel_plan is None:
        raise ValueError(f"parallel tp={tp}: workload {workload.name!r} has no tensor-parallel plan; give "
                         f"Workload(tensor_parallel_plan=lambda sequence_parallel: zerokit.tensor_parallel.Plan(...))")
    from .tensor_parallel import check_plan

    seq_len = workload.batch(0)[0].shape[1] if sequence_parallel else None
    check_plan(workload.build_model(), workload.tensor_parallel_plan(sequence_parallel), tp, seq_len)
