"""ZeRO++'s quantizer next to DeepSpeed's: its kernels' refusal on the CPU, read from DeepSpeed itself."""
import os
import subprocess
import sys

import pytest
import torch

from zerokit.strategies import get

# --- DeepSpeed's quantizer on the CPU --------------------------------------------------------------

_LOAD_QUANTIZER = """
from deepspeed.ops.op_builder import QuantizerBuilder
try:
    QuantizerBuilder().load()
except Exception as e:
    print("RAISED", type(e).__name__, e, sep="|")
else:
    print("LOADED")
"""


def _load_deepspeed_quantizer_on_the_cpu_accelerator() -> str:
    """What DeepSpeed's own ``QuantizerBuilder().load()`` does under ``DS_ACCELERATOR=cpu``, in a fresh process
    (the accelerator is chosen once per process, at DeepSpeed's first import)."""
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    done = subprocess.run([sys.executable, "-c", _LOAD_QUANTIZER], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_deepspeed_quantizer_kernels_refuse_the_cpu_and_the_peer_names_their_reason():
    """DeepSpeed's qwZ and qgZ load ``QuantizerBuilder`` (CUDA kernels); on the CPU accelerator the load raises,
    and ``deepspeed-zeropp`` refuses both options quoting what DeepSpeed raised."""
    pytest.importorskip("deepspeed")
    from zerokit.peers.deepspeed import NO_CPU_QUANTIZER

    outcome = _load_deepspeed_quantizer_on_the_cpu_accelerator()
    assert outcome.startswith("RAISED|"), f"DeepSpeed's quantizer loaded on the CPU accelerator: {outcome}"
    _, kind, message = outcome.split("|", 2)
    assert kind == "ValueError" and message, outcome
    assert message in NO_CPU_QUANTIZER, (message, NO_CPU_QUANTIZER)
    if torch.cuda.is_available():
        return  # on a GPU the peer runs DeepSpeed's CUDA kernels: nothing to refuse
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):
        with pytest.raises(ValueError, match=key) as refused:
            get("deepspeed-zeropp").resolve_options({key: True})
        assert message in str(refused.value)


# --- the loss-effect run: on the rank's device ------------------------------------------------------

class _Workload:
    """Eight float inputs, eight targets; records where the loss saw them."""
    batch_size = 8

    def __init__(self):
        self.seen = []

    def build_model(self):
        return torch.nn.Linear(3, 1)

    def batch(self, step):
        return torch.randn(8, 3), torch.randn(8, 1)

    def loss(self, out, y):
        self.seen.append(("target", y.device, y.dtype))
        return torch.zeros(())


class _Tally:
    def take(self):
        return {"max_abs": 0.0, "mean_abs": 0.0, "max_bound": 0.0, "over_bound": 0, "elements": 0}


class _Recorder:
    """A strategy that records the devices of what it is given."""

    def __init__(self, model, ctx, config, **options):
        self.seen = [("model", p.device, p.dtype) for p in model.parameters()]
        self.weight_error = self.gradient_error = _Tally()

    def forward(self, x):
        self.seen.append(("input", x.device, x.dtype))
        return x

    def zero_grad(self):
        pass

    def backward(self, loss):
        pass

    def step(self):
        pass


@pytest.mark.parametrize("precision,dtype", [("fp32", torch.float32), ("bf16-mixed", torch.bfloat16)])
def test_the_loss_effect_run_puts_model_and_batches_on_the_rank_device(monkeypatch, precision, dtype):
    """launch picks NCCL where GPUs are, so every tensor a collective touches must be on ``ctx.device``: here a
    device that is not the host's ("meta"), so a tensor left on the host shows."""
    from types import SimpleNamespace

    from zerokit.optim import OptimizerSpec
    from zerokit.strategies import TrainConfig
    from zerokit.zero import zeropp_error

    made = []
    monkeypatch.setattr(zeropp_error, "get", lambda name: lambda *a, **k: made.append(_Recorder(*a, **k)) or made[-1])
    ctx = SimpleNamespace(rank=1, world_size=2, device=torch.device("meta"))
    work = _Workload()
    zeropp_error._train(ctx, work, "zeropp", {}, 2, TrainConfig(precision, OptimizerSpec("sgd", lr=0.1)), True)
    seen = made[0].seen + work.seen
    assert [kind for kind, _, _ in seen].count("input") == 2 and [kind for kind, _, _ in seen].count("target") == 2
    assert {device for _, device, _ in seen} == {ctx.device}, seen
    assert {d for kind, _, d in seen if kind != "target"} == {dtype}, seen
