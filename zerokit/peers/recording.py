"""A peer library's strategy: its forward, backward and step inside the ledger hooks.

The hooks themselves (:func:`ledgered_torch_collectives`, :class:`LedgeredFunctionalCollectives`)
live in :mod:`zerokit.runtime.torch_recording`, below the api that measures torch's own wrappers
with them; every peer strategy here runs each phase inside them.
"""
from __future__ import annotations

from ..runtime.torch_recording import LedgeredFunctionalCollectives, ledgered_torch_collectives
from ..strategies.base import Strategy

__all__ = ["LedgeredFunctionalCollectives", "Peer", "fp32_only", "ledgered_torch_collectives"]


class Peer(Strategy):
    """A library's strategy whose collectives are counted by :func:`ledgered_torch_collectives`.

    Subclasses implement ``run_step`` (and ``run_forward`` / ``run_backward`` where the
    library wraps the model); the loop's ``forward`` / ``backward`` / ``step`` run them
    inside the recording context.
    """

    peer = True

    def forward(self, inputs):
        with ledgered_torch_collectives(self.name):
            return self.run_forward(inputs)

    def backward(self, loss):
        with ledgered_torch_collectives(self.name):
            self.run_backward(loss)

    def step(self):
        with ledgered_torch_collectives(self.name):
            self.run_step()

    def run_forward(self, inputs):
        return self.model(inputs)

    def run_backward(self, loss):
        loss.backward()

    def run_step(self):
        raise NotImplementedError


def fp32_only(name: str, config) -> None:
    """Refuse bf16-mixed for a peer that steps the model's own parameters."""
    if config.precision != "fp32":
        raise ValueError(f"strategy {name!r} runs in fp32 only: it steps the model's own parameters, with no fp32 "
                         f"master copy to make bf16-mixed comparable; use precision='fp32'")
