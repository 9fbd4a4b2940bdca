"""``"fully-shard"``: ``zerokit.fully_shard`` inside ``zerokit.train``, measured side by side with ``zero3`` and FSDP2.

Lifecycle: construction calls :func:`~.fully_shard.fully_shard` on every repeated block, then on the
root (FSDP2's order), and builds the run's optimizer on ``model.parameters()`` — the shard
parameters, as a user's loop would; each step is that optimizer's ``step`` and ``zero_grad``.
Under ``bf16-mixed`` the policy is FSDP2's ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``.
"""
from __future__ import annotations

import torch

from .. import theory
from ..strategies.base import boolean, Option, register, Strategy
from ..strategies.blocks import repeated_blocks
from .fully_shard import fully_shard


@register
class FullyShard(Strategy):
    """``fully_shard`` on every repeated block, then the root, and a torch optimizer over ``model.parameters()``:
    the own-loop face inside ``zerokit.train`` (its ledgers next to ``zero3``'s and FSDP2's)."""

    name = "fully-shard"
    stage = 3
    options = {"reshard_after_forward": Option(True, boolean, "True (FSDP2's default) or False")}

    def __init__(self, model, ctx, config, **options):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        super().__init__(model, ctx, config, **options)
        # bf16-mixed: FSDP2's policy, fp32 shards stepped by the optimizer, bf16 gathers and gradient reductions
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if config.precision == "bf16-mixed" else None
        if policy is not None:  # zerokit.train casts the model to bf16: the masters are fp32 copies of those values
            for p in model.parameters():
                p.data = p.data.float()
        for name in sorted(repeated_blocks(model)):
            fully_shard(model.get_submodule(name), reshard_after_forward=self.opts["reshard_after_forward"],
                        mp_policy=policy)
        fully_shard(model, reshard_after_forward=self.opts["reshard_after_forward"], mp_policy=policy)
        self.face = model._zerokit_face
        self.faces = [*self.face.inner, self.face]
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = config.optimizer.build(self.params)

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def gathered(self):
        return self.face.whole()

    def full_parameters(self):
        """Every parameter whole, as fp32 on the CPU, under the model's names (a collective)."""
        with self.face.whole():
            return {n: p.detach().float().cpu().clone() for n, p in self.model.named_parameters()}

    def track_memory(self, ledger) -> None:
        for face in self.faces:
            face.strategy.track_memory(ledger)
        # the whole parameters of every unit: views into its gathered buffer (0 bytes while sharded), swapped into
        # the modules only for the unit's forward, gathered in backward too (autograd's saved views hold them)
        ledger.track("params", lambda: [whole for face in self.faces for pairs in face.swaps.values()
                                        for _, _, whole, _ in pairs])
        # under a 16-bit compute dtype: the copies of the whole (persistent, frozen) parameters a forward swaps in
        ledger.track("params", lambda: [during for face in self.faces for *_, during in face.root_swaps])
        ledger.track_optimizer(self.optimizer)

    def flat_units(self):
        return [u.flat.numel for face in self.faces for u in face.strategy.units]

    def optimizer_tensors(self) -> int:
        return len(self.params) if isinstance(self.optimizer, torch.optim.Adam | torch.optim.AdamW) else 0

    def theory_model_states(self, psi: int):
        return theory.fully_shard_model_state_bytes(psi, self.world, self.config.precision, self.config.optimizer.name,
                                                    units=self.flat_units(), optimizer_tensors=self.optimizer_tensors(),
                                                    frozen_numel=self.frozen_numel())

    def theory_comm_bytes(self, psi: int):
        b = theory.param_bytes_per_element(self.config.precision)  # gathers and reductions in the compute dtype
        return theory.comm_bytes_per_step(3, psi, self.world, b, self.config.micro_batches, units=self.flat_units(),
                                          reshard_after_forward=self.opts["reshard_after_forward"])
