"""ZeRO++'s quantizer next to DeepSpeed's: the error tally off the host in the step (and on the memory ledger when
on), DeepSpeed's kernels' refusal on the CPU read from DeepSpeed itself, and the loss-effect run on the rank's
device."""
import os
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager

import pytest
import torch

import zerokit
from zerokit.optim import OptimizerSpec
from zerokit.runtime.memory import MemoryLedger
from zerokit.runtime.nodes import RANKS_PER_NODE_ENV
from zerokit.strategies import TrainConfig, get

# --- options ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("options,name", [(dict(measure_quantization_error=1), "measure_quantization_error")])
def test_bad_codec_options_are_refused_before_any_process_starts(options, name):
    with pytest.raises(ValueError, match=name):
        get("zeropp").resolve_options(options)


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


# --- the error tally: no host sync in the step, its memory on the ledger ------------------------------

#: the Tensor methods that read a value back to the host (a stream sync on a GPU)
_HOST_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "nonzero", "cpu", "numpy")


@contextmanager
def _counting_host_reads():
    """Count every call of :data:`_HOST_READS` on a tensor inside the block."""
    counts, saved = Counter(), {}
    for name in _HOST_READS:
        saved[name] = torch.Tensor.__dict__.get(name)
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        setattr(torch.Tensor, name, counted)
    try:
        yield counts
    finally:
        for name, own in saved.items():
            if own is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)


BLOCK = 64
RUNS = {  # label: zeropp's options (qwZ + qgZ on 2 ranks as 2 nodes: qgZ's hop across nodes runs)
    "default": dict(zero_quantized_weights=True, zero_quantized_gradients=True),
    "measured": dict(zero_quantized_weights=True, zero_quantized_gradients=True, measure_quantization_error=True),
}


def _step(strategy, work, ctx, step):
    x, y = work.batch(step)
    per = x.shape[0] // ctx.world_size
    strategy.zero_grad()
    loss = work.loss(strategy.forward(x[ctx.rank * per:(ctx.rank + 1) * per]), y[ctx.rank * per:(ctx.rank + 1) * per])
    strategy.backward(loss)
    strategy.step()
    return loss.detach()


def _tally_run(ctx, options: dict) -> dict:
    torch.set_num_threads(1)
    work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=4)
    strategy = get("zeropp")(work.build_model(), ctx, TrainConfig("fp32", OptimizerSpec("sgd", lr=0.1)),
                             quantization_block_size=BLOCK, **options)
    memory = MemoryLedger()
    strategy.track_memory(memory)
    first = float(_step(strategy, work, ctx, 0))
    tallies = [strategy.weight_error.take(), strategy.gradient_error.take()]
    with _counting_host_reads() as in_step:
        _step(strategy, work, ctx, 1)
    with _counting_host_reads() as in_take:
        tallies += [strategy.weight_error.take(), strategy.gradient_error.take()]
    held = [t for tally in (strategy.weight_error, strategy.gradient_error) for t in tally.tensors()]
    return {"first_loss": first, "in_step": dict(in_step), "in_take": dict(in_take), "tallies": tallies,
            "buffers": memory.current()["buffers"], "held": sum(t.untyped_storage().nbytes() for t in held),
            "workspaces": [None if tally._workspace is None else tuple(tally._workspace.shape)
                           for tally in (strategy.weight_error, strategy.gradient_error)],
            "shards": [u.shard.numel() for u in strategy.units]}


def _runs(ctx):
    return {label: _tally_run(ctx, options) for label, options in RUNS.items()}


@pytest.fixture(scope="module")
def tally_runs():
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv(RANKS_PER_NODE_ENV, "1")
        yield zerokit.launch(_runs, 2)
    finally:
        mp.undo()


def test_a_zeropp_step_reads_nothing_back_to_the_host_for_its_tallies(tally_runs):
    """Default (unmeasured) and measured alike, the step's qwZ gathers and qgZ rows read no value back to the
    host; a measured tally is read once when taken, an unmeasured one not at all."""
    for rank in tally_runs:
        for label, run in rank.items():
            assert run["in_step"] == {}, (label, run["in_step"])
        assert rank["default"]["in_take"] == {}
        assert rank["measured"]["in_take"] == {"tolist": 2}  # one read per tally


def test_an_unmeasured_run_holds_nothing_and_tallies_nothing(tally_runs):
    for rank in tally_runs:
        run = rank["default"]
        assert run["held"] == 0 and run["workspaces"] == [None, None]
        assert all(t["elements"] == 0 and t["max_bound"] == 0 for t in run["tallies"])


def test_a_measured_run_shows_its_tallies_workspace_on_the_memory_ledger(tally_runs):
    """The workspaces (3 float32 rows of the longest round trip, whole blocks; the float64 totals are gone once
    taken) are the only difference between the measured and the unmeasured run's buffers."""
    for rank in tally_runs:
        measured, default = rank["measured"], rank["default"]
        assert measured["buffers"] - default["buffers"] == measured["held"] > 0
        longest = max(-(-c // BLOCK) * BLOCK for c in measured["shards"])
        weights, gradients = measured["workspaces"]
        assert weights == (3, longest)  # qwZ: every unit's shard
        assert gradients[0] == 3 and 0 < gradients[1] <= longest  # qgZ's hop across: rows of C
        assert measured["held"] == 4 * 3 * (weights[1] + gradients[1])


def test_measured_round_trips_are_within_their_bound(tally_runs):
    for rank in tally_runs:
        for tally in rank["measured"]["tallies"]:  # float32's roundings: |x|·4·2^-24, |x| ≤ qmax·scale
            assert tally["elements"] > 0 and tally["over_bound"] == 0
            assert 0 < tally["max_abs"] <= tally["max_bound"] * (1 + 2 ** -13)
