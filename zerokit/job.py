"""The job: every argument of ``zerokit.train`` checked and packed, before any process starts.

``make_job`` takes a :class:`~zerokit.config.JobConfig` (or the keywords it is made of), whose
parts checked their own fields when built (precision, steps, micro-batches, the mesh's
degrees, the checkpointing policy, the link). Here the parts meet each other, the strategy and
the model: the strategy's options, the mesh against the axes the strategy runs on, the
tensor-parallel plan, the pipeline's options, the checkpointing policy against the model's
blocks, the saved checkpoint to resume, the batch's divisibility — each with an error naming
the argument. It returns the :class:`Job` that is pickled to every rank
(:func:`zerokit.train.run_rank`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from .checkpoint.training import check_options as check_saving
from .activation_checkpointing import check_for_model
from .config import JOB_OPTIONS, JobConfig  # noqa: F401 - JOB_OPTIONS: part of zerokit.job's API
from .expert_parallel.apply import check_model as check_experts
from .context_parallel.apply import check_model as check_context_model
from .tensor_parallel import check_plan
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
    #: activation checkpointing policy on the model's repeated blocks (:mod:`zerokit.activation_checkpointing`)
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


def make_job(workload, strategy: Optional[str] = None, world_size: Optional[int] = None, steps: Optional[int] = None,
             precision: Optional[str] = None, optimizer: Optional[str] = None, lr: Optional[float] = None,
             micro_batches: Optional[int] = None, options: Optional[dict] = None, track_peak: bool = True,
             keep_records: bool = False, parallel: Optional[Dict[str, int]] = None,
             sequence_parallel: bool = False, checkpointing: str = "none",
             checkpoint_every: Optional[int] = None, link=None, save_dir=None, save_every=None,
             resume_from=None) -> Job:
    """Check every argument and build the job, before any process starts: ``make_job(config)`` with a
    :class:`~zerokit.config.JobConfig`, or the keywords it is made of (:meth:`JobConfig.from_keywords`)."""
    if isinstance(workload, JobConfig):
        given = [name for name, value in (("strategy", strategy), ("world_size", world_size), ("steps", steps),
                                          ("precision", precision), ("optimizer", optimizer), ("lr", lr),
                                          ("micro_batches", micro_batches), ("options", options))
                 if value is not None]
        if given:
            raise TypeError(f"make_job(config, …): the JobConfig holds every setting; {', '.join(given)} given too")
        return _checked(workload)
    missing = [name for name, value in (("strategy", strategy), ("world_size", world_size), ("steps", steps),
                                        ("precision", precision), ("optimizer", optimizer), ("lr", lr),
                                        ("micro_batches", micro_batches), ("options", options)) if value is None]
    if missing:
        raise TypeError(f"make_job() needs a JobConfig, or the keywords {', '.join(missing)}")
    return _checked(JobConfig.from_keywords(
        workload, strategy, world_size, steps, precision, optimizer, lr, micro_batches, options, track_peak,
        keep_records, parallel, sequence_parallel, checkpointing, checkpoint_every, link, save_dir=save_dir,
        save_every=save_every, resume_from=resume_from))


def _checked(config: JobConfig) -> Job:
    """The parts of ``config`` against each other, the strategy and the model; the :class:`Job` they make."""
    workload, strategy, dims, schedule = config.workload, config.strategy, config.parallel, config.schedule
    world_size, micro_batches, steps = dims.world_size, schedule.micro_batches, schedule.steps
    sequence_parallel, parallel = dims.sequence_parallel, dims.parallel
    cls = get_strategy(strategy)
    checkpointing, checkpoint_every = config.memory.checkpointing, config.memory.checkpoint_every
    if checkpointing != "none":
        check_for_model(workload.build_model(), checkpointing, checkpoint_every)
    options, saving = check_saving(workload, config.options, steps, config.save_dir, config.save_every,
                                   config.resume_from, schedule.optimizer)
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
    if hasattr(cls, "check_layout"):  # options checked against the layout (hsdp's shard_group_size against dp)
        cls.check_layout(options, shape)
    refusal = getattr(cls, "checkpoint_refusal", "")
    if refusal and (saving["save_dir"] is not None or saving["resume_from"] is not None):
        raise ValueError(f"strategy {cls.name!r} with save_dir or resume_from: {refusal}")
    if "pp" in cls.axes:
        pipeline = pipeline_only or shape["pp"] > 1
        check_pipeline(options, micro_batches, shape["pp"], cls.name, workload.build_model() if pipeline else None,
                       pipeline_only)
    _check_tensor_parallel(workload, cls, shape["tp"], sequence_parallel)
    cp_attention = dims.cp_attention
    if cls.name == "single":  # the one-process reference a comparison runs the same options against: no cp
        cp_attention = None
    cp_attention = _check_context_parallel(workload, shape, cp_attention, sequence_parallel)
    if shape.get("ep", 1) > 1:
        if shape.get("cp", 1) > 1 or shape["pp"] > 1:
            raise ValueError(f"parallel ep={shape['ep']} with cp={shape.get('cp', 1)}, pp={shape['pp']}: expert "
                             f"parallelism composes with dp and tp only so far; use cp=1, pp=1")
        check_experts(workload.build_model(), shape["ep"])
    batch = workload.batch_size
    degree = shape["dp"] if cls.data_parallel else 1
    if batch % (degree * micro_batches):
        raise ValueError(f"the workload's global batch of {batch} is not divisible by the data-parallel degree "
                         f"({degree}) times micro_batches ({micro_batches}); choose a batch size that is a "
                         f"multiple of {degree * micro_batches}")
    return Job(workload, strategy, steps, TrainConfig(config.precision.mode, schedule.optimizer_spec, micro_batches),
               dict(options), config.track_peak, config.keep_records, None if parallel is None else shape,
               sequence_parallel, checkpointing=checkpointing, checkpoint_every=checkpoint_every, link=config.link,
               **saving, cp_attention=cp_attention)


def _check_context_parallel(workload: Workload, shape: Dict[str, int], attention, sequence_parallel: bool) -> str:
    """``cp_attention`` and the model under cp > 1, before any process starts; a cp_attention without cp is refused
    (it would change nothing)."""
    cp = shape.get("cp", 1)
    if cp == 1:
        if attention is not None:
            raise ValueError(f"cp_attention={attention!r} applies only with context parallelism: add cp=2 (or more) "
                             f"to parallel")
        return "ring"
    attention = "ring" if attention is None else attention
    if shape["pp"] > 1:
        raise ValueError(f"parallel cp={cp} with pp={shape['pp']}: context parallelism composes with dp and tp only "
                         f"so far; use pp=1")
    if sequence_parallel:
        raise ValueError(f"sequence_parallel=True with cp={cp}: the sequence is already cut over cp; zerokit does "
                         f"not cut it again over tp (use sequence_parallel=False)")
    model = workload.build_model()
    seq_len = workload.batch(0)[0].shape[1]
    check_context_model(model, seq_len, cp, attention, tp=shape["tp"])
    return attention


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
    seq_len = workload.batch(0)[0].shape[1] if sequence_parallel else None
    check_plan(workload.build_model(), workload.tensor_parallel_plan(sequence_parallel), tp, seq_len)
