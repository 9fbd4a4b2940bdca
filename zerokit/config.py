"""Config as data: the arguments of ``zerokit.train`` and ``make_job`` as a few dataclasses.

::

    config = JobConfig(zerokit.tiny_gpt(), "zero2", ParallelDims(4, dp=2, tp=2), Precision("bf16-mixed"),
                       Schedule(steps=20, micro_batches=2), MemorySavers("every"))
    zerokit.train(config)        # the same run as zerokit.train(work, "zero2", 4, 20, "bf16-mixed", …)

Lifecycle: each part checks its own fields when it is built, with the checks the job has
always used (an error names the argument and what is allowed); :class:`JobConfig` takes the
keywords that ``--option`` may carry out of ``options`` (as ``make_job`` always did);
:func:`zerokit.job.make_job` then checks the parts against each other and against the model
(the plan, the pipeline, the batch's divisibility) and packs the :class:`~zerokit.job.Job`
every rank gets. The keyword calls, ``train(work, "ddp", 2, …)`` and ``make_job(work, "ddp", 2,
…)``, build a :class:`JobConfig` with :meth:`JobConfig.from_keywords` and mean the same.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, Optional

from . import theory
from .activation_checkpointing import check_policy
from .optim import OptimizerSpec
from .runtime.link import resolve as resolve_link
from .runtime.mesh import parse_parallel
from .strategies import get as get_strategy
from .workloads import Workload

#: keywords of ``train`` that ``--option`` / ``options_for`` may also carry, for every strategy
JOB_OPTIONS = ("checkpointing", "checkpoint_every", "link", "save_dir", "save_every", "resume_from", "cp_attention")
#: the mesh's axes, in the order ``parallel={…}`` names them
DIMS = ("dp", "cp", "ep", "tp", "pp")


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")


@dataclass(frozen=True)
class ParallelDims:
    """The ranks and their mesh: ``world_size`` ranks laid out ``dp`` × ``cp`` × ``tp`` × ``pp`` (``ep`` carved from
    ``dp``); a degree left None is not given (``dp`` then fills the rest; none given: every rank on dp).
    ``sequence_parallel`` shards the LayerNorm regions over tp; ``cp_attention`` (``"ring"``, ``"ulysses"``) is
    the attention across the cp ranks."""

    world_size: int = 2
    dp: Optional[int] = None
    cp: Optional[int] = None
    ep: Optional[int] = None
    tp: Optional[int] = None
    pp: Optional[int] = None
    sequence_parallel: bool = False
    cp_attention: Optional[str] = None

    def __post_init__(self):
        _positive_int("world_size", self.world_size)
        parse_parallel(self.parallel, self.world_size)
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"sequence_parallel={self.sequence_parallel!r} must be True or False")

    @property
    def parallel(self) -> Optional[Dict[str, int]]:
        """The degrees given, as ``train(parallel=…)`` takes them (None: none given)."""
        given = {axis: getattr(self, axis) for axis in DIMS if getattr(self, axis) is not None}
        return given or None

    @classmethod
    def of(cls, world_size: int, parallel: Optional[Dict[str, int]] = None, sequence_parallel: bool = False,
           cp_attention: Optional[str] = None) -> "ParallelDims":
        """From ``train``'s keywords: ``world_size`` and ``parallel={"dp": …, "tp": …}``."""
        _positive_int("world_size", world_size)
        parse_parallel(parallel, world_size)  # an unknown axis or a bad degree, named
        return cls(world_size, **(parallel or {}), sequence_parallel=sequence_parallel, cp_attention=cp_attention)


@dataclass(frozen=True)
class Precision:
    """What the model computes in: ``"fp32"``, or ``"bf16-mixed"`` (bf16 parameters, fp32 masters)."""

    mode: str = "fp32"

    def __post_init__(self):
        theory.check_precision(self.mode)


@dataclass(frozen=True)
class Schedule:
    """How long and how: ``steps`` optimizer steps of ``micro_batches`` micro-batches each, stepped by
    ``optimizer`` (``"adamw"``, ``"sgd"``, …) at learning rate ``lr``."""

    steps: int = 10
    micro_batches: int = 1
    optimizer: str = "adamw"
    lr: float = 1e-3

    def __post_init__(self):
        _positive_int("steps", self.steps)
        _positive_int("micro_batches", self.micro_batches)
        self.optimizer_spec  # noqa: B018 - the optimizer's name and lr, checked

    @property
    def optimizer_spec(self) -> OptimizerSpec:
        return OptimizerSpec(name=self.optimizer, lr=self.lr)


@dataclass(frozen=True)
class MemorySavers:
    """Activation checkpointing on the model's repeated blocks: ``checkpointing`` (``"none"``, ``"every"``,
    ``"every_k"`` with ``checkpoint_every``, ``"sqrt"``, ``"selective"``, …; :mod:`zerokit.activation_checkpointing`).
    Offloading is a strategy's option (``offload=…``), in :attr:`JobConfig.options`."""

    checkpointing: str = "none"
    checkpoint_every: Optional[int] = None

    def __post_init__(self):
        check_policy(self.checkpointing, self.checkpoint_every)


@dataclass(frozen=True)
class JobConfig:
    """One run: the workload, the strategy and its ``options``, and the parts above; ``track_peak`` and
    ``keep_records`` say what is measured, ``link`` the emulated link (:mod:`zerokit.runtime.link`), and
    ``save_dir`` / ``save_every`` / ``resume_from`` the sharded checkpoints (:mod:`zerokit.checkpoint.training`)."""

    workload: Workload
    strategy: str = "ddp"
    parallel: ParallelDims = field(default_factory=ParallelDims)
    precision: Precision = field(default_factory=Precision)
    schedule: Schedule = field(default_factory=Schedule)
    memory: MemorySavers = field(default_factory=MemorySavers)
    options: Dict[str, Any] = field(default_factory=dict)
    track_peak: bool = True
    keep_records: bool = False
    link: Any = None
    save_dir: Optional[str] = None
    save_every: Optional[int] = None
    resume_from: Optional[str] = None

    def __post_init__(self):
        check_workload(self.workload)
        get_strategy(self.strategy)  # an unknown name, with the known ones
        for name, kind in (("parallel", ParallelDims), ("precision", Precision), ("schedule", Schedule),
                           ("memory", MemorySavers)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"JobConfig({name}=…) needs a zerokit.config.{kind.__name__}, got "
                                f"{type(getattr(self, name)).__name__}")
        options = dict(self.options)
        carried = {k: options.pop(k) for k in JOB_OPTIONS if k in options}  # what --option put there
        if "checkpointing" in carried or "checkpoint_every" in carried:
            object.__setattr__(self, "memory", MemorySavers(carried.get("checkpointing", self.memory.checkpointing),
                                                            carried.get("checkpoint_every",
                                                                        self.memory.checkpoint_every)))
        if "cp_attention" in carried:
            object.__setattr__(self, "parallel", replace(self.parallel, cp_attention=carried["cp_attention"]))
        for name in ("link", "save_dir", "save_every", "resume_from"):
            if name in carried:
                object.__setattr__(self, name, carried[name])
        object.__setattr__(self, "options", options)
        object.__setattr__(self, "link", resolve_link(self.link))

    @classmethod
    def from_keywords(cls, workload: Workload, strategy: str, world_size: int, steps: int, precision: str,
                      optimizer: str, lr: float, micro_batches: int, options: Optional[dict] = None,
                      track_peak: bool = True, keep_records: bool = False, parallel: Optional[Dict[str, int]] = None,
                      sequence_parallel: bool = False, checkpointing: str = "none",
                      checkpoint_every: Optional[int] = None, link=None, save_dir=None, save_every=None,
                      resume_from=None) -> "JobConfig":
        """The config that ``train``'s and ``make_job``'s keywords mean (a keyword in ``options`` wins, as the CLI's
        ``--option`` always did)."""
        check_workload(workload)
        get_strategy(strategy)
        options = dict(options or {})
        carried = {k: options.pop(k) for k in JOB_OPTIONS if k in options}
        checkpointing = carried.pop("checkpointing", checkpointing)
        checkpoint_every = carried.pop("checkpoint_every", checkpoint_every)
        cp_attention = carried.pop("cp_attention", None)
        memory = MemorySavers(checkpointing, checkpoint_every)
        link = carried.pop("link", link)
        return cls(workload, strategy, ParallelDims.of(world_size, parallel, sequence_parallel, cp_attention),
                   Precision(precision), Schedule(steps, micro_batches, optimizer, lr), memory, options,
                   track_peak, keep_records, link, **{"save_dir": save_dir, "save_every": save_every,
                                                      "resume_from": resume_from, **carried})


def check_workload(workload) -> None:
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a zerokit.Workload, got {type(workload).__name__}")
