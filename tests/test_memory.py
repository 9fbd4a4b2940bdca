"""The memory ledger reads bytes from storages, once each, and sees freeing."""
import torch
import torch.nn as nn

from zerokit import theory
from zerokit.runtime.memory import MemoryLedger
from zerokit.optim import MasterOptimizer, OptimizerSpec


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(13, 37), nn.Tanh(), nn.Linear(37, 7))


def test_model_states_equal_16_psi_for_fp32_adamw():
    model = _model()
    psi = sum(p.numel() for p in model.parameters())
    opt = MasterOptimizer(list(model.parameters()), OptimizerSpec("adamw"))
    ledger = MemoryLedger()
    ledger.track_model(model)
    ledger.track_optimizer(opt.optimizer)
    model(torch.randn(4, 13)).sum().backward()
    opt.step([p.grad for p in model.parameters()])
    expected = theory.model_state_bytes(0, psi, 1, "fp32", "adamw", optimizer_tensors=4)
    assert ledger.model_states() == {"params": 4 * psi, "grads": 4 * psi, "optimizer": 8 * psi + 16}
    assert sum(ledger.model_states().values()) == expected.total


def test_bf16_mixed_keeps_fp32_masters_as_optimizer_state():
    model = _model().to(torch.bfloat16)
    psi = sum(p.numel() for p in model.parameters())
    opt = MasterOptimizer(list(model.parameters()), OptimizerSpec("adamw"))
    ledger = MemoryLedger()
    ledger.track_model(model)
    ledger.track_optimizer(opt.optimizer)
    model(torch.randn(4, 13, dtype=torch.bfloat16)).float().sum().backward()
    opt.step([p.grad for p in model.parameters()])
    states = ledger.model_states()
    assert states == {"params": 2 * psi, "grads": 2 * psi, "optimizer": 12 * psi + 16}
    assert all(m.grad is None for m in opt.masters)  # fp32 grads lived for the step only


def test_views_into_one_storage_are_counted_once():
    flat = torch.zeros(100)
    ledger = MemoryLedger()
    ledger.track("params", lambda: [flat[:50], flat[50:], flat])
    ledger.track("buffers", lambda: [flat[10:20]])  # already counted under params
    assert ledger.current()["params"] == 400 and ledger.current()["buffers"] == 0


def test_a_storage_resized_to_zero_costs_nothing():
    buffer = torch.zeros(256)
    view = buffer[:128]
    ledger = MemoryLedger()
    ledger.track("buffers", lambda: [view])
    assert ledger.current()["buffers"] == 1024
    buffer.untyped_storage().resize_(0)
    assert ledger.current()["buffers"] == 0


def test_activations_live_until_backward_and_peak_is_kept():
    model = _model()
    ledger = MemoryLedger()
    ledger.track_model(model)
    ledger.instrument(model)
    x = torch.randn(8, 13)
    with ledger.watch_activations():
        loss = model(x).pow(2).sum()
    during = ledger.current()["activations"]
    ledger.sample("after forward")
    # saved: the input x, tanh output (37), the first linear's output feeds tanh (37); the pow input (7)
    assert during >= 8 * (13 + 37 + 7) * 4
    loss.backward()
    assert ledger.current()["activations"] == 0
    assert ledger.peak_total >= during + ledger.current()["params"]
    assert ledger.peak_where
    ledger.remove_hooks()
