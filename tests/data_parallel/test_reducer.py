"""The shared reducer: after a backward that raises mid-way, the next steps train as if it never happened.

The model raises in backward on every rank at step 1, after the last layers' gradients
were produced (so some reductions are already in flight). The loop catches it, zeroes
the gradients and goes on; the result must equal the single-process reference that
skipped the same step.
"""
import pytest
import torch
import torch.nn as nn

import zerokit
from zerokit.optim import OptimizerSpec
from zerokit.strategies import TrainConfig, get

STRATEGIES = ["ddp", "zero1", "zero2", "zero3"]
FAIL_AT = 1
STEPS = 4


class Boom(torch.autograd.Function):
    """Identity forward; backward raises while ``Fuse.armed``."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if Fuse.armed:
            raise RuntimeError("boom in backward")
        return grad


class Fuse(nn.Module):
    armed = False

    def forward(self, x):
        return Boom.apply(x)


def model():
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(13, 37), nn.Tanh(), Fuse(), nn.Linear(37, 29), nn.Tanh(), nn.Linear(29, 7))


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(12, 13, generator=g), torch.randint(0, 7, (12,), generator=g)


def loss_fn(out, y):
    return nn.functional.cross_entropy(out, y)


def _train(ctx, name, options):
    torch.set_num_threads(1)
    strategy = get(name)(model(), ctx, TrainConfig(optimizer=OptimizerSpec("sgd", lr=0.1)), **options)
    raised = []
    for step in range(STEPS):
        strategy.zero_grad()
        x, y = batch(step)
        per = x.shape[0] // ctx.world_size
        x, y = x[ctx.rank * per:(ctx.rank + 1) * per], y[ctx.rank * per:(ctx.rank + 1) * per]
        loss = loss_fn(strategy.forward(x), y)
        Fuse.armed = step == FAIL_AT
        try:
            strategy.backward(loss)
        except RuntimeError as e:
            raised.append(str(e))
            continue
        finally:
            Fuse.armed = False
        strategy.step()
    return raised, strategy.full_parameters()


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_step_after_a_failed_backward_trains_like_the_reference(name):
    # small buckets / units so that reductions are in flight when backward raises
    options = {"ddp": {"bucket_mb": 0.001}, "zero1": {"reduce_bucket_size": 300},
               "zero2": {"reduce_bucket_size": 300}, "zero3": {"unit_size": 0}}[name]
    reference = _train(zerokit.RankContext(0, 1, torch.device("cpu"), "none"), "single", {})
    for n in (2, 3):
        results = zerokit.launch(_train, n, name, options)
        for raised, params in results:
            assert raised == ["boom in backward"]
        params = results[0][1]
        assert max(float((params[k] - reference[1][k]).abs().max()) for k in params) <= 1e-6, (name, n)
