"""Exercise 11: CPU offload of the optimizer step — ZeRO-Offload's d2h gradient shard, host Adam, h2d parameters
(Ren et al. 2101.06840 §4).

Interface: ``HostAdam(param_shard, lr)`` with ``master`` (the fp32 host copy of the shard, a
Parameter), ``host_grad`` (the host gradient buffer), ``optimizer`` (AdamW over the master)
and ``step(grad_shard, param_shard)``; the exercise's given ``Zero2Offload(model, lr)``
reduce-scatters the mean gradient to the rank's shard, calls it, and all-gathers the shards.
Graded on 2 ranks, in one launch: the parameters after 3 steps against single-process AdamW;
the memory ledger after the step — optimizer states on the device (an optimizer whose
parameters are device tensors keeps its states there: torch allocates them next to the
parameter) and the host's master, states and gradient buffer against
:func:`zerokit.theory.offload_model_state_bytes`; the transfer ledger
(:mod:`zerokit.offload.transfers`) against :func:`zerokit.theory.offload_transfer_bytes`.
"""
from __future__ import annotations

import torch

from ... import theory
from ...offload.transfers import ledger as transfers
from ...runtime.memory import MemoryLedger
from .. import reference as ref
from ..core import Check, Exercise, Fail, Scenario
from .common import same_params

STEPS = 3
LR = 1e-2
N = 2
SIZES = (8, 16, 16, 4)


def _model():
    return ref.mlp(SIZES)


def psi() -> int:
    return sum(p.numel() for p in _model().parameters())


def shard_numel() -> int:
    return -(-psi() // N)


def _optimizers(*objects) -> list:
    found = []
    for obj in objects:
        for value in vars(obj).values():
            if isinstance(value, torch.optim.Optimizer) and all(value is not f for f in found):
                found.append(value)
    return found


def _key(t):
    return t.untyped_storage().data_ptr()


def _ledger(zero, model) -> dict:
    """The memory ledger's bytes by category, and which optimizer counted where."""
    device = [*model.parameters(), zero.unit.data, zero.grads, zero.grad_shard, zero.param_shard]
    on_device = {_key(t) for t in device}
    ledger = MemoryLedger()
    ledger.track("params", lambda: device)
    host = zero.host
    where = []
    for opt in _optimizers(host, zero):
        params = [p for group in opt.param_groups for p in group["params"]]
        steps_device = any(_key(p) in on_device for p in params)
        ledger.track_optimizer(opt, host=not steps_device)
        where.append("device" if steps_device else "host")
    if isinstance(getattr(host, "host_grad", None), torch.Tensor):
        ledger.track("host_grads", lambda: [host.host_grad])
    now = ledger.current()
    return {"optimizer": now["optimizer"], "host_optimizer": now["host_optimizer"],
            "host_grads": now["host_grads"], "optimizers": where}


def _train(ctx, ns, probe):
    model = _model()
    initial = ref.named_params(model)
    zero = ns["Zero2Offload"](model, LR)
    transfers().reset()
    rows = ref.local_rows(12, ctx.rank, ctx.world_size)
    out = {}
    for step in range(STEPS):
        x, y = ref.batch(step)
        ref.mse(model(x[rows]), y[rows]).backward()
        zero.step()
        if step == 0:
            out["ledger"] = _ledger(zero, model)
    records = [{"direction": r.direction, "bytes": r.payload_bytes, "dtype": r.dtype}
               for r in transfers().records]
    return {**out, "transfers": records, "params": ref.named_params(model), "initial": initial}


def reference_run():
    return ref.train_single(_model, STEPS, lambda p: torch.optim.AdamW(p, lr=LR), ref.batch)


def _judge_parity(results, ns):
    expected = reference_run()["params"]
    for rank, r in enumerate(results):
        if ref.worst(r["params"], r["initial"])[0] == 0.0:
            raise Fail(f"rank {rank}'s parameters never changed in {STEPS} steps: the host stepped its master, but the "
                       f"updated values never came back — copy the master into param_shard (h2d) after the step",
                       "updated parameters", "the initial ones", rank)
    return same_params(results, expected, STEPS, "AdamW") + " — the on-device step's, run on the host"


def _judge_device(results, ns):
    for rank, r in enumerate(results):
        led = r["ledger"]
        if "device" in led["optimizers"]:
            raise Fail(f"rank {rank} keeps {led['optimizer']:,} B of optimizer state on the device: its optimizer steps "
                       f"a tensor on the device (the shard itself, not a host copy), so torch allocated Adam's m and v "
                       f"there. Step an fp32 master made with to_host(param_shard), and nothing of the optimizer "
                       f"stays on the device", "0 B on the device", f"{led['optimizer']:,} B", rank)
        if not led["optimizers"]:
            raise Fail(f"rank {rank}: no torch optimizer found on HostAdam (self.optimizer)", "an AdamW on the host",
                       "none", rank)
    return "the ledger counts 0 bytes of optimizer state on the device: master, m and v live on the host"


def _judge_host(results, ns):
    _, host = theory.offload_model_state_bytes(2, psi(), N, precision="fp32", units=[psi()], optimizer_tensors=1)
    shard = shard_numel()
    for rank, r in enumerate(results):
        led = r["ledger"]
        if led["host_optimizer"] != host.optimizer:
            missing = host.optimizer - led["host_optimizer"]
            why = ""
            if missing == 4 * shard:
                why = (": the fp32 master is missing — the optimizer steps the device's own shard, or a view of it; "
                       "the host needs its own fp32 copy (to_host)")
            elif led["host_optimizer"] == 0:
                why = ": no optimizer steps on the host"
            raise Fail(f"rank {rank}'s host holds {led['host_optimizer']:,} B of master + optimizer state{why}",
                       f"{host.optimizer:,} B = 4·shard (master) + 8·shard (m, v) + 4 (step)",
                       f"{led['host_optimizer']:,} B", rank)
        if led["host_grads"] != host.grads:
            raise Fail(f"rank {rank}'s host gradient buffer holds {led['host_grads']:,} B: the host needs room for "
                       f"exactly the rank's gradient shard ({shard} elements)", f"{host.grads:,} B",
                       f"{led['host_grads']:,} B", rank)
    return (f"host: {host.optimizer:,} B of master + m + v + step and {host.grads:,} B of gradient buffer = "
            f"theory.offload_model_state_bytes(2, Ψ={psi()}, N={N}, precision='fp32')'s host part")


def _judge_transfers(results, ns):
    expected = theory.offload_transfer_bytes(2, shard_numel(), 4)
    full = psi() * 4
    for rank, r in enumerate(results):
        for direction, what in (("d2h", "gradient shard"), ("h2d", "parameter shard")):
            rows = [t for t in r["transfers"] if t["direction"] == direction]
            per_step = sum(t["bytes"] for t in rows) / STEPS
            if per_step != expected[direction] or len(rows) != STEPS:
                why = ""
                if per_step == 0:
                    why = (" — nothing crossed: copy with zerokit.offload.transfers.copy, which counts the bytes"
                           if direction == "d2h" else " — the updated parameters never came back to the device")
                elif per_step >= full:
                    why = (f" — the whole {'gradient' if direction == 'd2h' else 'parameters'} ({full:,} B) crossed: "
                           f"under ZeRO each rank owns 1/N and sends only its {what}")
                raise Fail(f"rank {rank}: {len(rows) / STEPS:g} {direction} copies per step, {per_step:,.0f} B{why}",
                           f"1 copy, {expected[direction]:,} B", f"{per_step:,.0f} B", rank)
    return (f"per step one d2h copy of the gradient shard and one h2d copy of the parameter shard, "
            f"{expected['d2h']:,} B each = theory.offload_transfer_bytes(2, shard={shard_numel()}, 4)")


EXERCISE = Exercise(
    key="11_cpu_offload",
    title="CPU offload of the optimizer step",
    minutes=30,
    needs=("HostAdam", "Zero2Offload"),
    scenarios={"train": Scenario("train", N, _train)},
    checks=[
        Check("same-as-on-device", 3, "train", _judge_parity,
              "the host's step is the same arithmetic as the device's: the gradient shard out, Adam on the fp32 "
              "master, the parameters back"),
        Check("no-device-optimizer", 2, "train", _judge_device,
              "ZeRO-Offload keeps the fp32 master and Adam's states on the host: 0 bytes of optimizer state on the "
              "accelerator (2101.06840 §4)"),
        Check("host-states", 2, "train", _judge_host,
              "the host holds the shard's fp32 master, m and v (12 B per element in fp32) and its gradient buffer"),
        Check("transfers", 2, "train", _judge_transfers,
              "per step the gradient shard goes out and the parameter shard comes back: 2·shard·b bytes on the link"),
    ],
    hints=[
        "ZeRO-Offload moves the optimizer to the host: the fp32 master copy and Adam's moments live in CPU memory, and "
        "the step runs there. Each step ships the gradient shard down (device to host) and the updated parameter shard "
        "back up (host to device); nothing else crosses the link.",
        "HostAdam's __init__: the master is a Parameter holding a host copy of the parameter shard, in fp32 (the given "
        "to_host helper copies it, once); a host buffer shaped like the shard receives the gradients; AdamW steps the "
        "master.",
        "step: copy the gradient shard into the host buffer with the given copy helper (direction d2h), make it the "
        "master's gradient and step — on the host, since the master is there.",
        "Then the way back: copy the master into the device's parameter shard (direction h2d), in the shard's dtype. "
        "Without it the device keeps the old parameters, and the all-gather spreads them.",
        "The code:\n"
        "__init__:\n"
        "    self.master = torch.nn.Parameter(to_host(param_shard.detach(), 'master').float())\n"
        "    self.host_grad = host_empty(param_shard)\n"
        "    self.optimizer = torch.optim.AdamW([self.master], lr=lr)\n"
        "step:\n"
        "    copy(self.host_grad, grad_shard.detach(), 'd2h', 'grads')\n"
        "    self.master.grad = self.host_grad.float()\n"
        "    self.optimizer.step()\n"
        "    self.master.grad = None\n"
        "    copy(param_shard, self.master.detach().to(param_shard.dtype), 'h2d', 'params')",
    ],
)
