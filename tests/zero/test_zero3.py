"""ZeRO-3's unit lifecycle on real models: tied weights, evaluation, checkpointed blocks, stale gathers, prefetch.

Parity tests use SGD (AdamW turns ~1e-10 summation noise into ~lr steps, FACTS §10) and
compare with the single-process reference to 1e-5 after a few steps.
"""
import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

import zerokit
from zerokit.cli import compare
from zerokit.optim import OptimizerSpec
from zerokit.runtime.memory import MemoryLedger
from zerokit.strategies import TrainConfig, get
from zerokit.workloads import TinyGPT, Workload
from zerokit.zero.units import State, form_units

SGD = dict(optimizer="sgd", lr=0.1)
DATA_PARALLEL = ["ddp-naive", "ddp-bucketed", "ddp", "zero1", "zero2-naive", "zero2", "zero3"]


def tied_gpt(n_layer=2):
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=n_layer, n_head=2, batch_size=12,
                            tie_weights=True)


# --- tied weights ---------------------------------------------------------------------------------

def test_tied_parameter_joins_the_unit_of_its_modules_common_ancestor():
    model = tied_gpt().build_model()
    assert model.head.weight is model.tok.weight
    for unit_size in ("block", 0, 1000):
        units = form_units(model, unit_size, set())
        owner = [label for _, label, params in units if any(p is model.tok.weight for p in params)]
        assert owner == ["TinyGPT"], unit_size  # the root holds both the embedding and the head
        assert sum(len(ps) for _, _, ps in units) == len(list(model.parameters()))  # each tensor once


@pytest.mark.parametrize("n", [2, 3])
def test_every_strategy_trains_a_tied_gpt_like_the_reference(n):
    report = compare(tied_gpt(), n, ["single", *DATA_PARALLEL], steps=3, **SGD)
    for name in DATA_PARALLEL:
        result = report[name]
        assert result.param_diff["max_abs"] <= 1e-5, (name, result.param_diff)
        assert result.losses == pytest.approx(report["single"].losses, abs=1e-5), name
        for rank in result.ranks:
            assert rank.model_state_bytes == {k: rank.theory_model_states[k] for k in ("params", "grads",
                                                                                          "optimizer")}, name


@pytest.mark.parametrize("n", [2, 3])
def test_tied_gpt_in_bf16_mixed_precision_lands_within_a_bf16_ulp(n):
    names = ["ddp", "zero1", "zero2", "zero3", "fully-shard"]
    report = compare(tied_gpt(), n, ["single", *names], steps=3, precision="bf16-mixed", **SGD)
    for name in names:
        assert report[name].param_diff["max_rel"] <= 1e-3, (name, report[name].param_diff)  # 2^-11 at N=3
        for rank in report[name].ranks:
            assert rank.model_state_bytes == {k: rank.theory_model_states[k] for k in ("params", "grads",
                                                                                          "optimizer")}, name


def test_zero3_per_module_units_train_a_tied_gpt():
    report = compare(tied_gpt(), 3, ["single", "zero3"], steps=3, options_for=lambda name: {"unit_size": 0}
                     if name == "zero3" else {}, **SGD)
    assert report["zero3"].param_diff["max_abs"] <= 1e-5


# --- driving the strategy directly --------------------------------------------------------------

def _strategy(ctx, work, name="zero3", **options):
    torch.set_num_threads(1)
    return get(name)(work.build_model(), ctx, TrainConfig(optimizer=OptimizerSpec("sgd", lr=0.1)), **options)


def _local(work, ctx, step):
    x, y = work.batch(step)
    per = x.shape[0] // ctx.world_size
    return x[ctx.rank * per:(ctx.rank + 1) * per], y[ctx.rank * per:(ctx.rank + 1) * per]


def _train_step(strategy, work, ctx, step, between=None):
    strategy.zero_grad()
    x, y = _local(work, ctx, step)
    strategy.backward(work.loss(strategy.forward(x), y))
    if between is not None:
        between(strategy, x)
    strategy.step()


def _reference_params(work, steps):
    ctx = zerokit.RankContext(0, 1, torch.device("cpu"), "none")
    single = _strategy(ctx, work, "single")
    for step in range(steps):
        _train_step(single, work, ctx, step)
    return single.full_parameters()


def _largest_difference(params, reference):
    return max(float((params[k] - reference[k]).abs().max()) for k in reference)


def _evaluate_then_measure(ctx):
    work = tied_gpt()
    strategy = _strategy(ctx, work)
    ledger = MemoryLedger()
    strategy.track_memory(ledger)
    _train_step(strategy, work, ctx, 0)
    after_step = ledger.current()["params"]
    with torch.no_grad():
        strategy.forward(_local(work, ctx, 1)[0])
    return {"after_step": after_step, "after_eval": ledger.current()["params"],
            "states": [u.state.value for u in strategy.units],
            "theory": strategy.theory_model_states(work.param_count()).params}


def test_an_evaluation_forward_frees_every_unit_it_gathered():
    for result in zerokit.launch(_evaluate_then_measure, 2):
        assert result["states"] == [State.SHARDED.value] * len(result["states"])
        assert result["after_eval"] == result["after_step"] == result["theory"]  # shards only: 4Ψ/N padded


def _gather_between_backward_and_step(ctx, steps):
    """Leave units gathered between backward and step (as an unused prefetch or an evaluation would)."""
    work = tied_gpt()
    strategy = _strategy(ctx, work)

    def leave_gathered(strategy, x):
        for unit in strategy.units:
            strategy._gather(unit)
            unit.wait()
        with torch.no_grad():
            strategy.forward(x)

    for step in range(steps):
        _train_step(strategy, work, ctx, step, between=leave_gathered)
    return strategy.full_parameters()


def test_a_gather_between_backward_and_step_never_leaves_stale_parameters():
    params = zerokit.launch(_gather_between_backward_and_step, 2, 3)[0]
    assert _largest_difference(params, _reference_params(tied_gpt(), 3)) <= 1e-5


def _prefetch_in_flight(ctx, budget_units, prefetch):
    work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=6, n_head=2, batch_size=12)
    probe = _strategy(ctx, work, prefetch=False)
    block = probe.units[0].flat.padded_numel  # units 0..5 are the blocks, the root is last
    strategy = _strategy(ctx, work, prefetch=prefetch, prefetch_bucket_size=budget_units * block)
    for step in range(3):
        _train_step(strategy, work, ctx, step)
    return {"block": block, "ahead": strategy.prefetcher.max_ahead_numel,
            "in_flight": strategy.prefetcher.max_units_in_flight,
            "blocks": [u.label for u in strategy.units]}


@pytest.mark.parametrize("budget_units", [1, 2])
def test_every_unit_in_flight_counts_against_the_prefetch_budget(budget_units):
    result = zerokit.launch(_prefetch_in_flight, 2, budget_units, True)[0]
    assert result["blocks"] == [f"blocks.{i}" for i in range(6)] + ["TinyGPT"]
    # ahead of the current unit: exactly the budget's worth of blocks, never more (the old rule launched
    # budget_units more at every unit, on top of those already in flight)
    assert result["ahead"] == budget_units * result["block"]
    assert result["in_flight"] <= 2 + budget_units  # the root, the current block, the prefetched ones
    off = zerokit.launch(_prefetch_in_flight, 2, budget_units, False)[0]
    assert off["ahead"] == 0 and off["in_flight"] <= 2


# --- activation checkpointing ---------------------------------------------------------------------

class CheckpointedGPT(TinyGPT):
    """The tiny GPT with every block under non-reentrant activation checkpointing.

    ``early_stop=False`` makes the recompute run each block's forward to its end (torch
    otherwise stops it as soon as the saved tensors are back, before the block's
    forward hooks run), so the unit's post-forward hook fires in the middle of backward.
    """

    def __init__(self, *args, early_stop=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.early_stop = early_stop

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        with set_checkpoint_early_stop(self.early_stop):
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False)
        return self.head(self.ln_f(x))


def checkpointed_gpt(early_stop):
    base = tied_gpt()
    return Workload("checkpointed-gpt", lambda: CheckpointedGPT(64, 16, 32, 2, 2, tie_weights=True,
                                                                early_stop=early_stop),
                    base.batch_fn, base.loss_fn)


@pytest.mark.parametrize("unit_size,early_stop", [("block", True), ("block", False), (0, False)])
def test_a_checkpointed_block_is_gathered_again_for_its_recompute(unit_size, early_stop):
    report = compare(checkpointed_gpt(early_stop), 2, ["single", "zero3"], steps=3,
                     options_for=lambda name: {"unit_size": unit_size} if name == "zero3" else {}, **SGD)
    zero3 = report["zero3"]
    assert zero3.param_diff["max_abs"] <= 1e-5
    # the recompute gathers a freed unit once more per step at most; the reduce-scatters are unchanged
    rank = zero3.ranks[0]
    assert rank.comm_ring_cost_bytes_per_step >= rank.theory_comm_bytes_per_step


def test_units_accept_only_block_or_a_size():
    work = tied_gpt()
    for bad in ("blocks", -1, 1.5, True, None):
        with pytest.raises(ValueError, match="unit_size"):
            zerokit.train(work, "zero3", world_size=2, steps=1, unit_size=bad)


def test_block_units_fall_back_to_modules_without_repeated_blocks():
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    assert [label for _, label, _ in form_units(model, "block", set())] == ["0", "2"]
