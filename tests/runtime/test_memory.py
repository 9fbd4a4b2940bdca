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


def test_a_ledger_for_a_device_counts_model_states_held_elsewhere_as_the_hosts():
    """torch's non-fused Adam keeps ``step`` on the host while the parameters are on a GPU: here the ledger's device
    is the CPU and one optimizer state sits on another device (meta), so it must leave the device's optimizer."""
    from zerokit.runtime.memory import MemoryLedger

    p = torch.nn.Parameter(torch.zeros(8))
    opt = torch.optim.AdamW([p])
    p.grad = torch.zeros(8)
    opt.step()
    opt.state[p]["step"] = torch.zeros((), device="meta")
    on_cpu, anywhere = MemoryLedger(torch.device("cpu")), MemoryLedger()
    for ledger in (on_cpu, anywhere):
        ledger.track_optimizer(opt)
    now, everything = on_cpu.current(), anywhere.current()
    assert now["optimizer"] == 3 * 8 * 4  # the parameter (its own master), m and v
    assert now["host_optimizer"] == 4 and now["total"] == everything["total"] - 4
    assert everything["host_optimizer"] == 0


def test_the_allocator_is_read_next_to_the_ledger_at_every_sample(monkeypatch):
    from zerokit.runtime import memory

    ledger = memory.MemoryLedger(torch.device("cpu"))
    t = torch.zeros(256)
    ledger.track("buffers", t)
    assert ledger.sample("first") == 1024 and ledger.allocator_at_peak is None  # the CPU: no allocator to read
    allocated = iter([1024 + 300, 4096 + 100])
    monkeypatch.setattr(memory, "_allocated", lambda device: next(allocated))
    ledger.reset_peak()
    ledger.sample("small")
    t2 = torch.zeros(768)
    ledger.track("buffers", t2)
    ledger.sample("big")
    assert ledger.peak_total == 4096 and ledger.allocator_at_peak == 4196
    assert (ledger.allocator_gap_max, ledger.allocator_gap_where) == (300, "small")


def test_adam_keeps_step_beside_the_parameters_on_the_cpu_or_when_fused():
    from types import SimpleNamespace

    from zerokit.optim import adam_steps_beside_params

    on = lambda device, **flags: SimpleNamespace(param_groups=[{"params": [torch.empty(1, device=device)], **flags}])  # noqa: E731
    assert adam_steps_beside_params(on("cpu"))
    assert not adam_steps_beside_params(on("meta"))  # a device that is not the CPU, non-fused: steps on the host
    assert adam_steps_beside_params(on("meta", fused=True)) and adam_steps_beside_params(on("meta", capturable=True))


def test_step_transients_name_the_gap():
    from zerokit import theory

    t = theory.step_transients(8, 256, 4096, 1000, "bf16-mixed")
    assert t == {"logits' gradient": 8 * 256 * 4096 * 2, "fp32 copies of 16-bit gradients": 4000,
                 "cuBLAS workspace": 2 * 4096 * 1024 + 8 * 16 * 1024}
    assert theory.step_transients(1, 1, 1, 1000)["fp32 copies of 16-bit gradients"] == 0
