"""ZeRO++'s quantizer next to DeepSpeed's: its grid held to DeepSpeed's formula, the error tally off the host in
the step (and on the memory ledger when on), DeepSpeed's kernels' refusal on the CPU read from DeepSpeed itself,
and the loss-effect run on the rank's device."""
import os
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager

import numpy as np
import pytest
import torch

import zerokit
from zerokit import theory
from zerokit.optim import OptimizerSpec
from zerokit.runtime.memory import MemoryLedger
from zerokit.runtime.nodes import RANKS_PER_NODE_ENV
from zerokit.strategies import TrainConfig, get
from zerokit.zero.quantize import ErrorTally, dequantize_blocks, quantize_blocks

# --- DeepSpeed's grid, from its kernel's formula ------------------------------------------------------


def _deepspeed_reference(x: torch.Tensor, block: int, bits: int):
    """DeepSpeed's ``Params<Symmetric, bits>`` element by element in numpy float32 (csrc/includes/
    quantization_utils.h): m = 2^bits/(2·absmax) (1 for an all-zero group), code = clamp(rint(x·m),
    −2^(bits−1), 2^(bits−1) − 1) with rint half to even (``__float2int_rn``), the stored scale 1/m.
    Returns (codes, scales)."""
    values = x.reshape(-1).to(torch.float32).numpy()
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    codes, scales = [], []
    for start in range(0, values.size, block):
        group = values[start:start + block]
        absmax = np.float32(np.abs(group).max())
        m = np.float32(1.0) if absmax == 0 else np.float32(2 ** bits) / (np.float32(2) * absmax)
        codes += [int(min(max(np.rint(np.float32(v * m)), low), high)) for v in group]
        scales.append(np.float32(1) / m)
    return codes, np.array(scales, dtype=np.float32)


def _codes(q, numel, bits, block):
    """The signed codes of ``q`` (int8, or int4 two per byte), read back through unit scales."""
    ones = torch.ones(-(-numel // block))
    return [int(c) for c in dequantize_blocks(q, ones, block, numel, bits)]


def _tensors():
    g = torch.Generator().manual_seed(0)
    normal = torch.randn(1000, generator=g)
    outlier = torch.randn(64, generator=g) * 1e-3
    outlier[5] = 3.0  # +absmax: clipped one step down
    negative = torch.randn(64, generator=g) * 1e-2
    negative[9] = -2.5  # −absmax: the code −2^(bits−1), exact
    ties = torch.tensor([(2 * k + 1) / 256 for k in range(-8, 8)] + [1.0])  # m = 128: x·m at .5, half to even
    zero_block = torch.cat([torch.zeros(16), torch.randn(21, generator=g)])  # a zero block, a short last block
    halves = torch.randn(300, generator=g).to(torch.float16).float()  # fp16 values: DeepSpeed's input dtype
    return {"normal": normal, "outlier": outlier, "negative": negative, "ties": ties, "zero_block": zero_block,
            "halves": halves}


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("name", list(_tensors()))
def test_the_deepspeed_grid_gives_deepspeeds_codes_and_scales(name, block, bits):
    x = _tensors()[name]
    q, scales = quantize_blocks(x, block, bits, grid="deepspeed")
    codes, want_scales = _deepspeed_reference(x, block, bits)
    assert scales.numpy().tobytes() == want_scales.tobytes()  # bit for bit
    assert _codes(q, x.numel(), bits, block) == codes
    assert min(codes) >= -(2 ** (bits - 1)) and max(codes) <= 2 ** (bits - 1) - 1
    back = dequantize_blocks(q, scales, block, x.numel(), bits)
    per_element = torch.from_numpy(want_scales).repeat_interleave(block)[:x.numel()]
    assert torch.equal(back, torch.tensor(codes, dtype=torch.float32) * per_element)
    bound = torch.tensor([theory.block_quantization_error_bound(float(s), "deepspeed") for s in scales])
    rounding = x.abs() * ErrorTally.FLOAT32_ROUNDING  # m, 1/m, x·m and code·scale each round once in float32
    assert ((x - back).abs() <= bound.repeat_interleave(block)[:x.numel()] + rounding).all()


def test_the_deepspeed_grid_by_hand_clips_plus_absmax_and_uses_minus_two_to_the_b_minus_one():
    x = torch.tensor([1.0, -1.0, 0.5, 0.99, 0.0])  # absmax 1: m = 128 at int8
    q, scales = quantize_blocks(x, 5, 8, grid="deepspeed")
    assert scales.tolist() == [1 / 128] and q.tolist() == [127, -128, 64, 127, 0]
    back = dequantize_blocks(q, scales, 5, 5)
    assert back[0] == 1 - 1 / 128  # +absmax off by one whole step: the grid's bound, attained
    assert 1 - float(back[0]) == theory.block_quantization_error_bound(float(scales[0]), "deepspeed")
    q, scales = quantize_blocks(x, 5, 8)  # zerokit's symmetric grid: ±absmax on it, within scale/2
    assert scales.tolist() == [pytest.approx(1 / 127)] and q.tolist() == [127, -127, 64, 126, 0]
    four = torch.tensor([1.0, -1.0, 0.9, 0.0625, 0.1875, -0.4375])  # m = 8 at int4: 8, −8, 7.2, 0.5, 1.5, −3.5
    q, scales = quantize_blocks(four, 6, 4, grid="deepspeed")
    assert scales.tolist() == [0.125] and _codes(q, 6, 4, 6) == [7, -8, 7, 0, 2, -4]


def test_the_deepspeed_grid_in_theory():
    assert theory.block_quantization_scale(1.0, 8, "deepspeed") == 1 / 128
    assert theory.block_quantization_scale(1.0, 4, "deepspeed") == 1 / 8
    assert theory.block_quantization_scale(0.0, 8, "deepspeed") == 1.0
    assert theory.block_quantization_error_bound(0.01, "deepspeed") == 0.01
    assert theory.block_quantization_relative_bound(8, "deepspeed") == 1 / 128
    assert theory.block_quantization_relative_bound(4, "deepspeed") == 1 / 8
    assert theory.qgz_error_bound(1.0, 2, 2, 4, "deepspeed") == pytest.approx(2 * (2 / 8 + (2 + 2 / 8) / 8))
    assert theory.qgz_error_bound(1.0, 2, 2, 4) == pytest.approx(2 * (2 / 14 + (2 + 2 / 14) / 14))


def test_scales_cost_one_point_six_percent_at_int8_and_three_point_one_at_int4():
    """4 bytes of float32 scale per block of 256: 4/256 over int8's codes, 4/128 over int4's."""
    for bits, share in ((8, 0.015625), (4, 0.03125)):
        codes = 256 * bits // 8
        assert theory.quantized_bytes(256, 256, bits) - codes == 4 and 4 / codes == share


@pytest.mark.parametrize("call", [lambda: quantize_blocks(torch.randn(4), 2, 8, grid="asymmetric"),
                                  lambda: theory.block_quantization_scale(1.0, 8, "asymmetric"),
                                  lambda: theory.block_quantization_error_bound(1.0, "asymmetric"),
                                  lambda: ErrorTally("asymmetric")])
def test_a_bad_grid_is_refused_naming_it(call):
    with pytest.raises(ValueError, match="grid='asymmetric'.*'symmetric', 'deepspeed'"):
        call()


@pytest.mark.parametrize("options,name", [(dict(quantization_grid="asymmetric"), "quantization_grid"),
                                          (dict(quantization_grid=8), "quantization_grid"),
                                          (dict(measure_quantization_error=1), "measure_quantization_error")])
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
    "measured deepspeed": dict(zero_quantized_weights=True, zero_quantized_gradients=True,
                               measure_quantization_error=True, quantization_grid="deepspeed"),
    "qgz symmetric": dict(zero_quantized_gradients=True, measure_quantization_error=True),
    "qgz deepspeed": dict(zero_quantized_gradients=True, measure_quantization_error=True,
                          quantization_grid="deepspeed"),
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


def test_measured_round_trips_are_within_each_grids_bound(tally_runs):
    for rank in tally_runs:
        for label in ("measured", "measured deepspeed", "qgz symmetric", "qgz deepspeed"):
            for tally in rank[label]["tallies"]:
                if tally["elements"]:  # DeepSpeed's grid attains its bound at +absmax: float32's roundings show,
                    # |x|·4·2^-24 with |x| ≤ 2^(b−1)·scale, under 2^-13 of the bound on either grid
                    assert tally["over_bound"] == 0, label
                    assert 0 < tally["max_abs"] <= tally["max_bound"] * (1 + 2 ** -13), label
        assert all(t["elements"] > 0 for t in rank["measured"]["tallies"])


def test_the_grid_option_reaches_the_weights_and_the_gradients(tally_runs):
    """qwZ: the first forward computes with other weights on DeepSpeed's grid. qgZ alone leaves the first step's
    gradients exact, so its bound is the same blocks' on both grids: scale = absmax/8 against scale/2 =
    absmax/14 at int4, a ratio of 14/8."""
    for rank in tally_runs:
        assert rank["measured"]["first_loss"] != rank["measured deepspeed"]["first_loss"]
        assert rank["qgz symmetric"]["first_loss"] == rank["qgz deepspeed"]["first_loss"]
        ratio = rank["qgz deepspeed"]["tallies"][1]["max_bound"] / rank["qgz symmetric"]["tallies"][1]["max_bound"]
        assert ratio == pytest.approx(14 / 8, rel=2 ** -20)
