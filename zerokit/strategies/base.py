"""The interface every strategy implements, and the registry ``zerokit.train`` reads.

A strategy owns one rank's copy (or shard) of the model and its optimizer, and says
how to run forward, backward and the step. The training loop (``zerokit.train``)
drives it identically for every strategy, so their ledgers can be compared.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional

import torch
import torch.nn as nn

from .. import theory
from ..optim import GradientClipping, MasterOptimizer, OptimizerSpec
from ..runtime.context import RankContext
from ..runtime.memory import MemoryLedger
from .registry import REGISTRY, get, register  # noqa: F401 - strategies register here


@dataclass(frozen=True)
class TrainConfig:
    precision: str = "fp32"
    optimizer: OptimizerSpec = OptimizerSpec()
    micro_batches: int = 1


@dataclass(frozen=True)
class Option:
    """A strategy option: its default, a check, and what is allowed (for the error message)."""

    default: Any
    check: Any = None
    allowed: str = ""

    def validate(self, strategy: str, name: str, value):
        if self.check is not None and not self.check(value):
            raise ValueError(f"strategy {strategy!r}: option {name}={value!r} is not allowed; {self.allowed}")
        return value


def positive_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def boolean(x) -> bool:
    return isinstance(x, bool)


class Strategy:
    """One rank's share of training. Subclasses set ``name``, ``stage`` and ``options``."""

    name = "base"
    #: the ZeRO stage whose formulas describe this strategy's model states (0 = DDP)
    stage = 0
    #: the data-parallel degree is the world size unless a strategy says otherwise
    data_parallel = True
    #: the mesh axes this strategy can run on with a degree above 1
    axes = ("dp",)
    #: the strategy shards the model over ``tp`` itself (a peer library); otherwise the training loop applies
    #: zerokit's tensor-parallel plan before the strategy sees the model
    own_tensor_parallel = False
    #: accepted keyword options: name -> Option
    options: Dict[str, Option] = {}
    #: strategies implemented by a peer library (torch DDP, FSDP2, DeepSpeed)
    peer = False
    #: why the strategy refuses a pipeline (pp > 1) when it does for a reason of its own ("" otherwise)
    pipeline_refusal = ""
    #: modules to import in the launching process before its ranks fork, so that every rank inherits them
    #: instead of importing them again (a peer library's slow imports)
    preload: tuple = ()

    def __init__(self, model: nn.Module, ctx: RankContext, config: TrainConfig, **options):
        self.model = model
        self.ctx = ctx
        self.config = config
        self.opts = self.resolve_options(options)
        mesh = ctx.mesh
        #: the data-parallel axis of the mesh: its group, its size N and this rank's place on it — dp × cp when the
        #: sequence is cut over cp (those ranks hold the same weights: Megatron's data-parallel group with cp)
        axis = "dp_cp" if mesh.size("cp") > 1 else "dp"
        self.group = mesh.group(axis)
        self.world = mesh.size(axis)
        self.rank = mesh.coord(axis)
        #: False inside ``no_sync``: gradients accumulate locally, nothing is reduced
        self._sync = True

    @classmethod
    def resolve_options(cls, options: dict) -> dict:
        unknown = sorted(set(options) - set(cls.options))
        if unknown:
            allowed = ", ".join(sorted(cls.options)) or "none"
            raise ValueError(f"strategy {cls.name!r} has no option {', '.join(map(repr, unknown))}; "
                             f"allowed: {allowed}")
        resolved = {}
        for name, option in cls.options.items():
            value = options.get(name, option.default)
            resolved[name] = option.validate(cls.name, name, value)
        return resolved

    # -- training ---------------------------------------------------------------------
    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.model(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally for a micro-batch that is not the last of the step."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def step(self) -> None:
        raise NotImplementedError

    def finish_gradient_synchronization(self) -> None:
        """Reduce the gradients accumulated under :meth:`no_sync` now, outside any backward (a pipeline calls
        this once per step, after its last micro-batch's backward)."""
        raise NotImplementedError(f"strategy {self.name!r} reduces gradients only during backward")

    def zero_grad(self) -> None:
        for p in self.model.parameters():
            p.grad = None

    # -- measurement ------------------------------------------------------------------
    def track_memory(self, ledger: MemoryLedger) -> None:
        """Tell the memory ledger where this strategy keeps its tensors."""
        ledger.track_model(self.model)

    def full_parameters(self) -> Optional[Dict[str, torch.Tensor]]:
        """Every parameter, whole, as fp32 on the CPU (on rank 0; other ranks may return None)."""
        return {n: p.detach().float().cpu().clone() for n, p in self.model.named_parameters()}

    def frozen_numel(self) -> int:
        """Elements of the parameters with ``requires_grad=False``: held, never reduced, sharded or stepped."""
        return sum(p.numel() for p in self.model.parameters() if not p.requires_grad)

    def flat_units(self):
        """Sizes of the flat buffers the strategy shards (None: it shards nothing)."""
        return None

    def optimizer_tensors(self) -> int:
        """How many tensors the optimizer steps (Adam keeps a step scalar for each)."""
        return 0

    def stepped_sharded(self) -> list:
        """For each tensor the optimizer steps: whether it is this rank's shard of a whole the data-parallel group
        holds (True), or a whole tensor every rank holds the same (False) — what a gradient norm sums over."""
        return [False] * len(self.optimizer.tensors)

    def clip_gradients(self, max_norm: float) -> None:
        """Clip the gradients to ``max_norm`` (their global 2-norm) before every step, as DeepSpeed's
        ``gradient_clipping`` does (:class:`zerokit.optim.GradientClipping`)."""
        if self.ctx.mesh.size("tp") > 1 or self.ctx.mesh.size("pp") > 1:
            raise ValueError("gradient clipping with tp or pp above 1 is not implemented: the norm would need the "
                             "tp and pp groups too; set gradient_clipping to 0")
        self.optimizer.clipping = GradientClipping(max_norm, self.stepped_sharded(), self.group)

    def theory_model_states(self, psi: int) -> theory.ModelStates:
        offload = getattr(self, "offload", None)  # a ZeRO strategy's zerokit.offload: device and host
        if offload is not None:
            return offload.theory_model_states(psi)
        return theory.model_state_bytes(self.stage, psi, self.world, self.config.precision,
                                        self.config.optimizer.name, units=self.flat_units(),
                                        optimizer_tensors=self.optimizer_tensors())

    def theory_transfer_bytes(self) -> Optional[dict]:
        """Formula: device↔host bytes per step, ``{"d2h": …, "h2d": …}`` (zerokit.offload); None: not modelled."""
        offload = getattr(self, "offload", None)
        return None if offload is None else offload.theory_transfer_bytes()

    def theory_comm_bytes(self, psi: int):
        b = theory.param_bytes_per_element(self.config.precision)
        return theory.comm_bytes_per_step(self.stage, psi, self.world, b,
                                          self.config.micro_batches, units=self.flat_units())


class Replicated(Strategy):
    """Every rank holds every parameter and steps it whole (single, DDP and its variants)."""

    def __init__(self, model: nn.Module, ctx: RankContext, config: TrainConfig, **options):
        super().__init__(model, ctx, config, **options)
        #: parameters with requires_grad=False are neither reduced nor stepped
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = MasterOptimizer(self.params, config.optimizer)

    def step(self) -> None:
        self.optimizer.step([p.grad for p in self.params])

    def track_memory(self, ledger: MemoryLedger) -> None:
        super().track_memory(ledger)
        ledger.track_optimizer(self.optimizer.optimizer)

    def optimizer_tensors(self) -> int:
        return self.optimizer.step_scalars

    def theory_model_states(self, psi: int) -> theory.ModelStates:
        """Stage 0 with the frozen parameters held but neither given gradients nor stepped."""
        trained = {id(p): p.numel() for p in self.params}
        frozen = sum(p.numel() for p in self.model.parameters() if id(p) not in trained)
        return theory.model_state_bytes(self.stage, psi, self.world, self.config.precision, self.config.optimizer.name,
                                        units=self.flat_units(), optimizer_tensors=self.optimizer_tensors(),
                                        frozen_numel=frozen)
