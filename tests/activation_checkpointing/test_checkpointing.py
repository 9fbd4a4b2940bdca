"""Activation checkpointing (``zerokit.checkpointing``): parity with dropout on, recompute counts, the
command line and bad input. The bytes each policy keeps, against theory:
tests/activation_checkpointing/test_checkpointing_ledger.py.

Parity: with dropout the masks are random, so a checkpointed run must restore the RNG state for
its recompute (and leave the training stream where it was) to match. Each multi-rank run is
compared with the same strategy, ranks and seed *without* checkpointing (with dropout a
multi-rank run does not match the single process: every rank draws its own masks). Measured
differences are exactly 0: the recompute repeats the same kernels on the same inputs; the
tolerance is fp32's 1e-6 all the same.
"""
import copy
import json

import pytest
import torch
import torch.nn as nn

import zerokit
from zerokit.activation_checkpointing import apply_checkpointing, checkpointing_of, remove_checkpointing
from zerokit.activation_checkpointing.function import outer_hooks
from zerokit.activation_checkpointing.measure import ScaleBlock, scale_chain
from zerokit.cli import main as cli_main
from zerokit.workloads import TinyGPT

POLICIES = ["every", ("every_k", 3), "sqrt", "selective", "torch-every", "torch-selective"]


def _policy(p):
    return p if isinstance(p, tuple) else (p, None)


def dropout_gpt(n_layer=4):
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=n_layer, n_head=2, batch_size=12,
                            dropout=0.1)


def _params(report):
    return report.results[0].ranks[0].params


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# --- parity -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES, ids=str)
def test_one_process_every_policy_trains_like_no_checkpointing_with_dropout(policy):
    name, every = _policy(policy)
    work = dropout_gpt()
    plain = zerokit.train(work, "single", world_size=1, steps=2, reference=False)
    checked = zerokit.train(work, "single", world_size=1, steps=2, reference=False, checkpointing=name,
                            checkpoint_every=every)
    assert _max_diff(_params(checked), _params(plain)) <= 1e-6  # fp32, same masks: bitwise in practice
    assert checked.results[0].losses == plain.results[0].losses
    assert checked.results[0].ranks[0].recomputed_forwards == 4 * 2  # 4 blocks (or cores), 2 steps


def test_the_recompute_restores_the_masks_and_leaves_the_training_stream_alone():
    torch.manual_seed(0)
    base = TinyGPT(64, 16, 32, 3, 2, dropout=0.5)
    idx = torch.randint(0, 64, (2, 16))

    def run(policy):
        model = copy.deepcopy(base)
        handle = apply_checkpointing(model, policy) if policy != "none" else None
        torch.manual_seed(1)
        model(idx).pow(2).mean().backward()
        after = torch.rand(4)  # the stream the next step's dropout would draw from
        return {n: p.grad for n, p in model.named_parameters()}, after, handle

    grads, after, _ = run("none")
    for policy in ("every", "torch-every"):
        g, a, handle = run(policy)
        assert _max_diff(g, grads) == 0, policy
        assert torch.equal(a, after), policy
        assert handle.recomputed_forwards == 3


_BASELINES: dict = {}


@pytest.mark.parametrize("strategy,world,policy,micro", [
    ("ddp", 2, "every", 2), ("zero1", 2, "sqrt", 1), ("zero2", 2, "selective", 1), ("zero3", 2, ("every_k", 2), 1),
    ("zero3", 2, "torch-selective", 1), ("zero3", 3, "every", 1)], ids=str)
def test_data_parallel_strategies_train_alike_with_and_without_checkpointing(strategy, world, policy, micro):
    """zero3 frees a unit after its forward and gathers it again for the recompute, inside backward;
    every_k=2 also recomputes a block whose output needed no gradient hook. Each strategy's
    post-accumulate-grad hooks must see each gradient once: a second one raises in ddp and zero3."""
    name, every = _policy(policy)
    work = dropout_gpt()
    key = (strategy, world, micro)
    if key not in _BASELINES:
        _BASELINES[key] = zerokit.train(work, strategy, world_size=world, steps=2, micro_batches=micro,
                                        reference=False)
    plain = _BASELINES[key]
    checked = zerokit.train(work, strategy, world_size=world, steps=2, micro_batches=micro, reference=False,
                            checkpointing=name, checkpoint_every=every)
    assert _max_diff(_params(checked), _params(plain)) <= 1e-6
    assert checked.results[0].losses == pytest.approx(plain.results[0].losses, abs=1e-6)
    for rank in checked.results[0].ranks:
        assert rank.recomputed_forwards == 4 * micro * 2  # every block (core) once per micro-batch per step


def test_checkpointing_reaches_the_strategies_from_the_command_line(capsys, tmp_path):
    model = tmp_path / "gpt.py"
    model.write_text("import zerokit\n\ndef workload():\n    return zerokit.tiny_gpt(vocab=64, seq_len=16, "
                     "d_model=32, n_layer=2, n_head=2, batch_size=4)\n")
    code = cli_main(["compare", "--model", f"{model}:workload", "--world-size", "2", "--steps", "1",
                     "--strategies", "single,ddp", "--option", "checkpointing=every", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    for strategy in json.loads(out)["strategies"]:
        assert [r["recomputed_forwards"] for r in strategy["per_rank"]] == [2] * len(strategy["per_rank"])
        assert strategy["max_abs_param_diff_vs_reference"] <= 1e-6


# --- recompute counts ---------------------------------------------------------------------------------

def test_every_runs_one_extra_forward_per_block_per_micro_batch():
    torch.manual_seed(0)
    model = TinyGPT(64, 16, 32, 3, 2, dropout=0.1)
    calls = []
    for i, block in enumerate(model.blocks):
        block.register_forward_hook(lambda m, a, o, i=i: calls.append(i))
    handle = apply_checkpointing(model, "every")
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        model(idx)  # evaluation: nothing to recompute
    assert calls == [0, 1, 2] and handle.recomputed_forwards == 0
    for micro in range(2):
        calls.clear()
        model(idx).sum().backward()
        assert calls == [0, 1, 2, 2, 1, 0]  # forward, then backward recomputes each block once, last first
    assert handle.recomputed_forwards == 6


def test_each_parameter_hook_fires_once_per_backward():
    """Gradients flow through the original graph: post-accumulate-grad hooks (DDP, ZeRO) and tensor hooks
    (tensor parallelism's sequence-parallel all-reduce) see each parameter once, recompute or not."""
    torch.manual_seed(0)
    model = TinyGPT(64, 16, 32, 4, 2, dropout=0.1)
    accumulated, hooked = {}, {}

    def count(where, name):
        where[name] = where.get(name, 0) + 1

    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: count(accumulated, name))
        p.register_hook(lambda g, name=name: count(hooked, name))
    apply_checkpointing(model, "every_k", 2)
    model(torch.randint(0, 64, (2, 16))).sum().backward()
    names = [n for n, _ in model.named_parameters()]
    assert accumulated == hooked == dict.fromkeys(names, 1)


# --- bad input -----------------------------------------------------------------------------------------

def test_unknown_policy_and_bad_checkpoint_every_are_refused_before_any_process_starts():
    work = dropout_gpt()
    with pytest.raises(ValueError, match="known: none, every, every_k, sqrt, selective, torch-every"):
        zerokit.train(work, "ddp", world_size=2, steps=1, checkpointing="full")
    for bad in (0, -1, 5, 1.5, None, True):
        with pytest.raises(ValueError, match="checkpoint_every"):
            zerokit.train(work, "ddp", world_size=2, steps=1, checkpointing="every_k", checkpoint_every=bad)
    with pytest.raises(ValueError, match="checkpoint_every=2 applies to checkpointing='every_k' only"):
        zerokit.train(work, "ddp", world_size=2, steps=1, checkpointing="every", checkpoint_every=2)
    with pytest.raises(ValueError, match="above the model's 4 blocks"):
        apply_checkpointing(work.build_model(), "every_k", 5)


def test_applying_twice_is_refused_and_remove_gives_the_blocks_back():
    model = dropout_gpt().build_model()
    handle = apply_checkpointing(model, "every")
    assert checkpointing_of(model) is handle
    with pytest.raises(ValueError, match="already applied to this model \\(policy 'every'\\)"):
        apply_checkpointing(model, "sqrt")
    remove_checkpointing(model)
    assert checkpointing_of(model) is None and all("forward" not in b.__dict__ for b in model.blocks)
    assert apply_checkpointing(model, "sqrt").segments == [("blocks.0", "blocks.1"), ("blocks.2", "blocks.3")]


def test_a_model_without_repeated_blocks_is_refused():
    with pytest.raises(ValueError, match="has no repeated blocks"):
        apply_checkpointing(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), "every")


def test_a_first_block_on_inputs_without_gradient_still_trains_its_parameters():
    torch.manual_seed(0)
    model = scale_chain(3, 8)
    x = torch.randn(4, 8)  # the model's input: no gradient
    plain = copy.deepcopy(model)
    plain(x).sum().backward()
    apply_checkpointing(model, "every")
    model(x).sum().backward()
    assert _max_diff({n: p.grad for n, p in model.named_parameters()},
                     {n: p.grad for n, p in plain.named_parameters()}) == 0


def test_checkpointing_a_block_where_nothing_needs_a_gradient_says_it_has_no_effect():
    model = scale_chain(3, 8)
    model[0].w.requires_grad_(False)
    apply_checkpointing(model, "every")
    with pytest.raises(ValueError, match="checkpointing block '0' has no effect: autograd saved nothing"):
        model(torch.randn(4, 8))


def test_selective_without_attention_and_segments_of_unchained_blocks_are_refused():
    model = scale_chain(3, 8)
    apply_checkpointing(model, "selective")
    with pytest.raises(ValueError, match="calls no scaled_dot_product_attention"):
        model(torch.randn(4, 8, requires_grad=True))

    class Unchained(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(ScaleBlock(8) for _ in range(2))

        def forward(self, x):
            return self.blocks[1](self.blocks[0](x) * 2)

    model = Unchained()
    apply_checkpointing(model, "every_k", 2)
    with pytest.raises(RuntimeError, match="was not called on the output of block 'blocks.0'"):
        model(torch.randn(4, 8))
    assert outer_hooks() is None  # the broken segment's saved-tensor hooks were popped
