"""The memory ledger samples backward where autograd hands out gradients: on the parameters a module holds when
its forward runs, not only on those the model held when the ledger was instrumented.

A sharded model holds shards at rest and swaps its gathered parameters into the modules for the forward
(FSDP2's ``fully_shard`` its unsharded parameters, ``zerokit.fully_shard`` its whole ones); autograd gives the
gradients to those. :class:`Swapping` does the same with one ``Linear``: a pre-forward hook, registered before
the ledger's, puts the whole parameters in, a forward hook puts the shards back.
"""
import torch
import torch.nn as nn

from zerokit.runtime.memory import MemoryLedger


class Swapping(nn.Module):
    """A Linear whose registered parameters are 1-element stand-ins at rest and the whole ones in its forward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(5, 3)
        self.whole = {n: p for n, p in self.lin.named_parameters()}
        self.rest = {n: nn.Parameter(torch.zeros(1)) for n in self.whole}
        self._put(self.rest)
        self.lin.register_forward_pre_hook(lambda m, args: self._put(self.whole))
        self.lin.register_forward_hook(lambda m, args, out: self._put(self.rest))

    def _put(self, params):
        for name, p in params.items():
            self.lin._parameters[name] = p

    def forward(self, x):
        return self.lin(x)


def _backward_samples(model, ledger, steps=2):
    """Samples taken during each backward (the forward's are counted apart)."""
    out = []
    for _ in range(steps):
        loss = model(torch.randn(4, 5)).sum()
        before = ledger.samples
        loss.backward()
        out.append(ledger.samples - before)
    return out


def test_parameters_swapped_in_for_the_forward_are_sampled_as_their_gradients_come_once_each():
    model = Swapping()
    ledger = MemoryLedger()
    ledger.instrument(model)
    # one sample per whole parameter per backward (weight, bias), every step: hooked once, at the first forward
    assert _backward_samples(model, ledger) == [2, 2]
    ledger.remove_hooks()
    assert _backward_samples(model, ledger) == [0, 0]


def test_a_model_whose_parameters_stay_put_is_sampled_once_per_parameter_as_before():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 2))
    ledger = MemoryLedger()
    ledger.track_model(model)
    ledger.instrument(model)
    assert _backward_samples(model, ledger) == [4, 4]
