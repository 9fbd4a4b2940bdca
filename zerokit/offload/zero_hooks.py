"""The ``offload`` option of ``zero1``, ``zero2`` and ``zero3``, and the hooks those strategies call.

Each ZeRO strategy builds one :class:`Offload` before its optimizer and calls it at five
points of its lifecycle; with ``offload="none"`` every hook does what the strategy did
before (a :class:`~zerokit.optim.MasterOptimizer` on the device, the device's ledgers):

1. **construction**: ``Offload(strategy, mode)`` — with ``"params"`` (zero3) the unit
   shards move to the host now (:mod:`.param_offload`); then :meth:`Offload.optimizer`
   builds the strategy's optimizer over its shards: a
   :class:`~.host_optimizer.HostOptimizer` when offloading;
2. **gathers** (zero3): :meth:`Offload.gather_fn` wraps the all-gather so that a resting
   shard is fetched first;
3. **after each backward** (zero2, zero3): :meth:`Offload.after_backward` copies the
   reduced gradient shards to the host and drops the device's copies, so the device holds
   no gradient from one backward to the next (with ``contiguous_gradients`` the single
   shard buffer is dropped too: the shards are then allocated per unit as each is
   reduced). zero1 reduces once per step and hands its gradient shards to the step;
4. **step**: the strategy's own ``optimizer.step(grads)`` — shards still on the device are
   copied out there, those already on the host are passed as None;
5. **measurement**: :meth:`Offload.track_optimizer`, :meth:`Offload.category` (where the
   parameter shards rest), :meth:`Offload.theory_model_states` and
   :meth:`Offload.theory_transfer_bytes` (:mod:`zerokit.theory.offload`, exact per rank).

``"params"`` implies the optimizer offload: the host optimizer updates the resting shard
in place. DeepSpeed's ``offload_param`` and ``offload_optimizer`` are separate keys, but a
parameter shard on the host with its optimizer on the device would cross the link twice
more per step for nothing; the configurations that offload parameters offload both.
SGD is supported as well as AdamW (the host steps it with ``SGD(fused=True)``).
"""
from __future__ import annotations

from typing import Optional

from .. import theory
from ..optim import MasterOptimizer
from ..strategies.base import Option
from . import OFFLOADS
from .host_optimizer import HostOptimizer
from .param_offload import ParamOffload

_OPTIMIZER = ("'optimizer' (gradient shards go to the host, where the fp32 master, the optimizer states and the "
              "step live; the updated shards come back)")


def offload_option(stage: int) -> Option:
    """``offload`` for ZeRO stage ``stage``: 'none', 'optimizer', and at stage 3 'params'."""
    if stage == 3:
        return Option("none", lambda v: isinstance(v, str) and v in OFFLOADS,
                      f"allowed: 'none', {_OPTIMIZER} or 'params' (the optimizer offload, and the 16-bit parameter "
                      f"shards rest on the host: each gather fetches them)")
    return Option("none", lambda v: isinstance(v, str) and v in OFFLOADS[:2],
                  f"allowed: 'none' or {_OPTIMIZER}; 'params' (parameter shards on the host) needs ZeRO stage 3: "
                  f"strategy zero3 (DeepSpeed's offload_param is stage 3 only too)")


class Offload:
    """One ZeRO strategy's offload: its optimizer, its resting parameter shards, its hooks and its theory."""

    def __init__(self, strategy, mode: str = "none"):
        if mode not in OFFLOADS:
            raise ValueError(f"offload={mode!r}; allowed: {', '.join(map(repr, OFFLOADS))}")
        self.strategy = strategy
        self.mode = mode
        self.host: Optional[HostOptimizer] = None
        self.params: Optional[ParamOffload] = None
        if mode == "params":
            self.params = ParamOffload(strategy.units, strategy.ctx.device)

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    # -- the hooks -------------------------------------------------------------------
    def optimizer(self, tensors, layout=None):
        """The strategy's optimizer over ``tensors`` (its shards; ``layout``: their parameters, see
        :class:`~zerokit.optim.MasterOptimizer`): on the device, or on the host."""
        spec = self.strategy.config.optimizer
        if not self.enabled:
            return MasterOptimizer(tensors, spec, layout)
        if spec.groups:
            raise ValueError("offload with an optimizer whose param groups have their own hyperparameters is not "
                             "implemented; give one set of hyperparameters, or drop the offload keys")
        resting = {id(u.shard) for u in self.strategy.units} if self.params is not None else set()
        self.host = HostOptimizer(tensors, spec, resident=[id(t) in resting for t in tensors],
                                  device=self.strategy.ctx.device)
        return self.host

    def gather_fn(self, gather):
        """zero3's all-gather, fetching a resting shard to the device first."""
        return gather if self.params is None else self.params.fetching(gather)

    def after_backward(self) -> None:
        """zero2 / zero3: the reduced gradient shards go to the host; the device keeps none of them."""
        if not self.enabled:
            return
        s = self.strategy
        n = len(s.units)
        if s.stage == 2:
            grads, s.shards = s.shards, [None] * n
        else:
            grads = list(s.grad_shards) + ([s.persistent_grad] if s.persistent is not None else [])
            s.grad_shards, s.persistent_grad = [None] * n, None
        self.host.grads_out(grads)
        s.shard_buffer = None  # each unit's shard is allocated again as it is reduced
        s._written = [False] * n  # and written whole: the host adds the micro-batches

    # -- measurement -----------------------------------------------------------------
    def category(self, name: str) -> str:
        """The ledger category of the strategy's parameter shards: ``host_params`` where they rest on the host."""
        return f"host_{name}" if self.params is not None else name

    def track_optimizer(self, ledger, optimizer) -> None:
        if self.host is None:
            ledger.track_optimizer(optimizer.optimizer)
        else:
            self.host.track_memory(ledger)

    def _layout(self) -> dict:
        s = self.strategy
        persistent = s.persistent_numel() if hasattr(s, "persistent_numel") else 0
        return dict(units=s.flat_units(), persistent_numel=persistent, frozen_numel=s.frozen_numel())

    def theory_model_states(self, psi: int) -> theory.ModelStates:
        """Formula: model states per rank, with the host's beside the device's when offloading (exact, padded)."""
        s = self.strategy
        precision, name = s.config.precision, s.config.optimizer.name
        if not self.enabled:
            return theory.model_state_bytes(s.stage, psi, s.world, precision, name,
                                            optimizer_tensors=s.optimizer_tensors(), **self._layout())
        return theory.offload_states(s.stage, psi, s.world, name, self.mode == "params", precision=precision,
                                     optimizer_tensors=s.optimizer_tensors(), **self._layout())

    def theory_transfer_bytes(self) -> dict:
        """Formula: ``{"d2h": …, "h2d": …}`` bytes of this rank per step (zeros without offload)."""
        s = self.strategy
        if not self.enabled:
            return {"d2h": 0, "h2d": 0}
        layout = self._layout()
        return theory.offload_transfer_bytes(
            s.stage, theory.shard_numel(layout["units"], s.world), theory.param_bytes_per_element(s.config.precision),
            s.config.micro_batches, self.mode == "params", layout["persistent_numel"],
            2 if s.opts.get("reshard_after_forward", True) else 1)
