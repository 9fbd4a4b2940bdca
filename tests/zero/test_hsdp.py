"""HSDP (``hsdp``, ``hsdp-zero2``) against one process, its formulas and FSDP2's ``fully_shard`` on a 2-D mesh.

Each run is launched once (module-scoped, one reference per workload and precision) and read by several tests:

- parity with one process on SGD, within :func:`zerokit.theory.parity.sgd_parity_bound` (two ulps of the largest
  parameter per step: fp32, and bf16's ulp under bf16-mixed), on the tiny GPT and on a tied GPT with frozen
  parameters: 4 ranks as 2 nodes × 2, 2 ranks (s = 1 and s = 2) and 6 ranks as 3 replicas × 2;
- the communication ledger's bytes per axis (``dp_shard``, ``dp_replicate``) equal to
  :func:`zerokit.theory.hsdp_collective_bytes` to the byte, with 1 and 2 micro-batches and the all-reduce once
  per step or every micro-batch; the memory ledger equal to :func:`zerokit.theory.hsdp_model_state_bytes`;
- ``fsdp2-hsdp``'s parameters equal to ``hsdp``'s (each sum is of two fp32 terms, which no order changes, and the
  division by 4 is exact);
- the replicas' all-reduce in backward by default (phase ``backward``, launched while backward's reduce-scatters
  still come, asynchronously, as the peer's), at the step with ``replicate_all_reduce="step"``, and each
  micro-batch summed once by a loop that calls backward twice without ``no_sync``;
- FSDP2's memory defaults, on the memory ledger's bytes: the parameters held at once equal to
  :func:`zerokit.theory.hsdp_peak_param_bytes` on both (the peer's prefetched unit is FSDP2's all-gather output),
  the peaks at the same sample in backward and equal but for the peer's AdamW step scalars (one per parameter,
  hsdp's one per unit), no gradient bytes from ``zero_grad`` to the next backward (as the peer), and a unit's
  gradients left in ``.grad`` until its backward is complete;
- a bad ``shard_group_size`` or ``replicate_all_reduce`` refused before any process starts.
"""
from contextlib import nullcontext

import os

import pytest
import torch

import zerokit

import test_zero as zero_tests
from zerokit import theory
from zerokit.job import make_job
from zerokit.optim import OptimizerSpec
from zerokit.report import param_difference
from zerokit.runtime.nodes import RANKS_PER_NODE_ENV
from zerokit.strategies import TrainConfig, get as get_strategy
from zerokit.theory.parity import sgd_parity_bound, ulp
from zerokit.train import run_job, run_reference

STEPS = 3
AXES = ("dp_shard", "dp_replicate")


def tiny_gpt():
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=24)


def frozen_tied_gpt():
    """test_zero's GPT whose token embedding is its head, position embedding and a LayerNorm bias frozen; a batch
    of 24 rows divides over 2, 3, 4 and 6 ranks."""
    return zero_tests.frozen_tied_gpt(batch_size=24)


WORKLOADS = {"gpt": tiny_gpt, "tied-frozen": frozen_tied_gpt}

#: (label, workload, world, strategy, micro_batches, precision, options)
RUNS = [
    ("4=2x2 hsdp", "tied-frozen", 4, "hsdp", 2, "fp32", dict(shard_group_size=2)),
    ("4=2x2 hsdp every", "tied-frozen", 4, "hsdp", 2, "fp32", dict(shard_group_size=2,
                                                                    all_reduce_every_micro_batch=True)),
    ("4=2x2 hsdp at step", "tied-frozen", 4, "hsdp", 2, "fp32", dict(shard_group_size=2,
                                                                      replicate_all_reduce="step")),
    ("4=2x2 hsdp-zero2", "tied-frozen", 4, "hsdp-zero2", 2, "fp32", dict(shard_group_size=2,
                                                                          reduce_bucket_size=5000)),
    ("4=2x2 fsdp2-hsdp", "tied-frozen", 4, "fsdp2-hsdp", 2, "fp32", dict(shard_group_size=2)),
    ("4=2x2 hsdp bf16", "tied-frozen", 4, "hsdp", 2, "bf16-mixed", dict(shard_group_size=2)),
    ("4=2x2 hsdp-zero2 bf16 every", "tied-frozen", 4, "hsdp-zero2", 2, "bf16-mixed",
     dict(shard_group_size=2, all_reduce_every_micro_batch=True)),
    ("4=2x2 gpt hsdp one node", "gpt", 4, "hsdp", 1, "fp32", dict(all_reduce_every_micro_batch=True)),
    ("4=2x2 gpt hsdp-zero2", "gpt", 4, "hsdp-zero2", 1, "fp32", dict(shard_group_size=2)),
    ("2 hsdp s=1", "tied-frozen", 2, "hsdp", 2, "fp32", dict(shard_group_size=1)),
    ("2 hsdp s=2", "tied-frozen", 2, "hsdp", 2, "fp32", dict(shard_group_size=2)),
    ("6=3x2 hsdp", "tied-frozen", 6, "hsdp", 2, "fp32", dict(shard_group_size=2)),
    ("6=3x2 hsdp-zero2 every", "tied-frozen", 6, "hsdp-zero2", 2, "fp32",
     dict(shard_group_size=2, all_reduce_every_micro_batch=True)),
]


@pytest.fixture(scope="module")
def results():
    """label → (result, its reference) for every run of :data:`RUNS`, one single-process reference per workload
    and precision. The run without ``shard_group_size`` takes one node: 2 ranks, the launcher's emulated node
    size."""
    references, out = {}, {}
    saved = os.environ.get(RANKS_PER_NODE_ENV)
    os.environ[RANKS_PER_NODE_ENV] = "2"
    try:
        for label, work, world, name, micro_batches, precision, options in RUNS:
            job = make_job(WORKLOADS[work](), name, world, STEPS, precision, "sgd", 0.1, micro_batches, options,
                           keep_records=True)
            if (work, precision) not in references:
                references[work, precision] = run_reference(job)
            out[label] = run_job(job, world, references[work, precision]), references[work, precision]
    finally:
        if saved is None:
            os.environ.pop(RANKS_PER_NODE_ENV)
        else:
            os.environ[RANKS_PER_NODE_ENV] = saved
    return out


@pytest.mark.parametrize("label", [run[0] for run in RUNS])
def test_trains_like_one_process(results, label):
    result, reference = results[label]
    reference = reference.params
    bound = sgd_parity_bound(reference, STEPS)
    if result.precision == "bf16-mixed":  # the parameters round to bf16 after each step
        bound = 2 * STEPS * ulp(max(float(t.abs().max()) for t in reference.values()), torch.bfloat16)
    assert result.param_diff["max_abs"] <= bound, (label, result.param_diff, bound)


@pytest.mark.parametrize("label", [run[0] for run in RUNS])
def test_ledgers_equal_the_formulas_to_the_byte(results, label):
    for rank in results[label][0].ranks:
        measured = {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items()}
        assert set(measured) <= set(AXES), (label, measured)  # every byte on a carved axis, none on dp
        # to the byte: over r = 3 replicas a ring all-reduce sends 4/3 of its payload, a fraction the ledger sums
        # call by call in floating point, so equal to far below a byte rather than bit for bit
        assert {a: measured.get(a, 0) for a in AXES} == pytest.approx(rank.theory_comm_bytes_by_axis, abs=1e-6), \
            (label, rank.rank)
        assert rank.model_state_bytes == {k: rank.theory_model_states[k] for k in ("params", "grads", "optimizer")}


def test_the_formulas_are_hierarchical_ones_on_the_units(results):
    """The strategy's formula is theory.hsdp_collective_bytes on its flat units: re-derived here by hand for one
    run (s = 2, r = 2, A = 2, once per step): per unit of u elements ⌈u/2⌉·2 padded, b = 4."""
    rank = results["4=2x2 hsdp"][0].ranks[0]
    by_axis = rank.theory_comm_bytes_by_axis
    padded_bytes = by_axis["dp_replicate"] * 2  # 2(r−1)/r·(P_s/s)·b with r = 2 is P_s/2·b; so P_s·b is twice it
    assert by_axis["dp_shard"] == (2 * 2 + 2) * padded_bytes // 2  # 2A gathers + A reduce-scatters of (1/2)·P_s·b
    every = results["4=2x2 hsdp every"][0].ranks[0].theory_comm_bytes_by_axis
    assert every == {"dp_shard": by_axis["dp_shard"], "dp_replicate": 2 * by_axis["dp_replicate"]}
    zero2 = results["4=2x2 hsdp-zero2"][0].ranks[0].theory_comm_bytes_by_axis
    assert zero2["dp_shard"] == (1 + 2) * padded_bytes // 2  # one gather per step, A reduce-scatters


def test_shard_groups_of_one_and_of_all(results):
    """s = 1: no gather, the whole gradient all-reduced over the 2 replicas (DDP); s = N: nothing across."""
    alone = results["2 hsdp s=1"][0].ranks[0].comm_bytes_by_axis
    assert set(alone) == {"dp_replicate"}
    whole = results["2 hsdp s=2"][0].ranks[0].comm_bytes_by_axis
    assert set(whole) == {"dp_shard"}


def test_the_default_shard_group_is_one_node(results):
    """Without shard_group_size, 4 ranks on emulated nodes of 2 shard over 2 and replicate over 2: traffic on both
    axes (s = 1 would send nothing on dp_shard, s = 4 nothing on dp_replicate)."""
    for rank in results["4=2x2 gpt hsdp one node"][0].ranks:
        assert rank.comm_bytes_by_axis["dp_shard"]["calls"] > 0, rank.rank
        assert rank.comm_bytes_by_axis["dp_replicate"]["calls"] > 0, rank.rank


def test_fsdp2_hsdp_equals_ours(results):
    ours, peer = results["4=2x2 hsdp"][0], results["4=2x2 fsdp2-hsdp"][0]
    assert param_difference(peer.ranks[0].params, ours.ranks[0].params)["max_abs"] == 0
    measured = {axis: row["ring_cost_bytes"] for axis, row in peer.ranks[0].comm_bytes_by_axis.items()}
    assert set(measured) == set(AXES)  # the peer's 2-D mesh groups are named in the ledger


def _clipped_norms(ctx):
    """One step of each HSDP strategy on 2 × 2 ranks with clipping on: the gradient norm it measured."""
    torch.set_num_threads(1)
    work, norms = tiny_gpt(), {}
    x, y = work.batch(0)
    per = x.shape[0] // ctx.world_size
    x, y = x[ctx.rank * per:(ctx.rank + 1) * per], y[ctx.rank * per:(ctx.rank + 1) * per]
    for name in ("hsdp", "hsdp-zero2"):
        strategy = get_strategy(name)(work.build_model(), ctx, TrainConfig(optimizer=OptimizerSpec("sgd", lr=0.1)),
                                      shard_group_size=2)
        strategy.clip_gradients(1e9)
        strategy.backward(work.loss(strategy.forward(x), y))
        strategy.step()
        norms[name] = strategy.optimizer.clipping.last_norm
    return norms


def test_the_gradient_norm_is_summed_over_the_shard_group_only():
    """The replicas hold the same shards: summing the squares over all 4 ranks would double the norm's square."""
    work = tiny_gpt()
    model = work.build_model()
    x, y = work.batch(0)
    work.loss(model(x), y).backward()
    expected = float(torch.stack([p.grad.square().sum() for p in model.parameters()]).sum().sqrt())
    # a sum of Ψ positive fp32 terms in another order: within Ψ·2⁻²⁴ relative (the standard bound); the square
    # of a norm summed over all 4 ranks would be twice the right one, √2 off
    bound = work.param_count() * 2.0 ** -24
    for norms in zerokit.launch(_clipped_norms, 4):
        for name, norm in norms.items():
            assert norm == pytest.approx(expected, rel=bound), name


@pytest.mark.parametrize("name", ["hsdp", "hsdp-zero2", "fsdp2-hsdp"])
@pytest.mark.parametrize("size, message", [(3, "does not divide the 4 data-parallel ranks"),
                                           (8, "does not divide the 4 data-parallel ranks"),
                                           (0, "option shard_group_size=0 is not allowed"),
                                           (True, "option shard_group_size=True is not allowed")])
def test_a_bad_shard_group_size_is_refused_before_any_process_starts(name, size, message):
    with pytest.raises(ValueError, match=message):
        make_job(tiny_gpt(), name, 4, 1, "fp32", "sgd", 0.1, 1, {"shard_group_size": size})


@pytest.mark.parametrize("options, message", [({"offload": "optimizer"}, "offload"),
                                              ({"param_persistence_threshold": 10}, "param_persistence_threshold")])
def test_what_hsdp_leaves_out_is_refused(options, message):
    with pytest.raises(ValueError, match=message):
        make_job(tiny_gpt(), "hsdp", 4, 1, "fp32", "sgd", 0.1, 1, options)


@pytest.mark.parametrize("name", ["hsdp", "hsdp-zero2"])
def test_checkpointing_is_refused_before_any_process_starts(name, tmp_path):
    with pytest.raises(ValueError, match="does not save hsdp's shards"):
        zerokit.train(tiny_gpt(), name, world_size=4, steps=1, save_dir=str(tmp_path), reference=False)


def test_the_formula_matches_zero3_at_s_equal_n():
    units = [1000, 2051]
    hsdp = theory.hsdp_collective_bytes(None, 4, 4, 2, 2, units=units)
    assert sum(hsdp["shard"].values()) == theory.comm_bytes_per_step(3, sum(units), 4, 2, 2, units=units)
    assert hsdp["replicate"] == {}


# --- where the replicas' all-reduce runs (FSDP2's: in the last micro-batch's backward) --------------------------

def _replicate_rows(rank):
    return [row for row in rank.comm_summary if row["axis"] == "dp_replicate"]


@pytest.mark.parametrize("label, phase", [("4=2x2 hsdp", "backward"), ("4=2x2 hsdp every", "backward"),
                                          ("4=2x2 hsdp-zero2", "backward"), ("4=2x2 fsdp2-hsdp", "backward"),
                                          ("4=2x2 hsdp at step", "step")])
def test_the_replicas_all_reduce_runs_in_backward_unless_asked_for_at_the_step(results, label, phase):
    for rank in results[label][0].ranks:
        assert {(row["phase"], row["op"]) for row in _replicate_rows(rank)} == {(phase, "all_reduce")}, label


def test_in_backward_each_unit_is_all_reduced_asynchronously_while_backward_goes_on(results):
    """Step 1, in launch order: every all-reduce is asynchronous, one per unit (A = 2: only the last micro-batch's
    backward all-reduces), and the first of them is launched before the step's last reduce-scatter — it is in
    flight while the rest of backward computes. At the step, nothing of it overlaps: all after the last one."""
    rank = results["4=2x2 hsdp"][0].ranks[0]
    step = [r for r in rank.comm_records if r["step"] == 1]
    reduces = [i for i, r in enumerate(step) if r["axis"] == "dp_replicate"]
    scatters = [i for i, r in enumerate(step) if r["op"] == "reduce_scatter"]
    assert len(reduces) == len(scatters) // 2  # a reduce-scatter per unit and micro-batch, an all-reduce per unit
    assert all(step[i]["async_op"] for i in reduces)
    assert reduces[0] < scatters[-1]
    at_step = [r for r in results["4=2x2 hsdp at step"][0].ranks[0].comm_records if r["step"] == 1]
    last_scatter = max(i for i, r in enumerate(at_step) if r["op"] == "reduce_scatter")
    assert all(i > last_scatter for i, r in enumerate(at_step) if r["axis"] == "dp_replicate")


def _two_micro_batches(ctx, no_sync_first):
    """One SGD step of hsdp (2 × 2 ranks) on two micro-batches, the first under no_sync or not: the whole
    parameters and the all-reduces per unit."""
    from zerokit.runtime import comm

    torch.set_num_threads(1)
    work = tiny_gpt()
    strategy = get_strategy("hsdp")(work.build_model(), ctx, TrainConfig(optimizer=OptimizerSpec("sgd", lr=0.1)),
                                    shard_group_size=2)
    x, y = work.batch(0)
    per = x.shape[0] // ctx.world_size
    x, y = x[ctx.rank * per:(ctx.rank + 1) * per], y[ctx.rank * per:(ctx.rank + 1) * per]
    for i, (xm, ym) in enumerate(zip(x.chunk(2), y.chunk(2))):
        with strategy.no_sync() if no_sync_first and i == 0 else nullcontext():
            strategy.backward(work.loss(strategy.forward(xm), ym) / 2)
    strategy.step()
    reduces = [r for r in comm.ledger().select(op="all_reduce") if r.axis == "dp_replicate"]
    return strategy.full_parameters(), len(reduces) / len(strategy.units)


@pytest.mark.parametrize("no_sync_first, per_unit", [(True, 1), (False, 2)])
def test_a_loop_without_no_sync_still_sums_each_micro_batch_once(no_sync_first, per_unit):
    """Under no_sync the first micro-batch is reduce-scattered, not all-reduced: the second all-reduces both
    (one all-reduce per unit). Without it each backward all-reduces its own part, added to the all-reduced shard:
    two per unit, and the same step, within the SGD parity bound of one process on the whole batch."""
    work = tiny_gpt()
    model = work.build_model()
    x, y = work.batch(0)
    work.loss(model(x), y).backward()
    with torch.no_grad():
        reference = {n: (p - 0.1 * p.grad).detach().clone() for n, p in model.named_parameters()}
    bound = sgd_parity_bound(reference, 1)
    for params, reduces in zerokit.launch(_two_micro_batches, 4, no_sync_first):
        assert reduces == per_unit
        assert param_difference(reference, params)["max_abs"] <= bound


@pytest.mark.parametrize("options, message", [
    ({"replicate_all_reduce": "later"}, "option replicate_all_reduce='later' is not allowed"),
    ({"replicate_all_reduce": "step", "all_reduce_every_micro_batch": True},
     "all_reduce_every_micro_batch=True all-reduces in every micro-batch's backward")])
@pytest.mark.parametrize("name", ["hsdp", "hsdp-zero2"])
def test_a_bad_replicate_all_reduce_is_refused_before_any_process_starts(name, options, message):
    with pytest.raises(ValueError, match=message):
        make_job(tiny_gpt(), name, 4, 1, "fp32", "sgd", 0.1, 1, {"shard_group_size": 2, **options})


# --- FSDP2's memory defaults, on the memory ledger ---------------------------------------------------------------

def deep_gpt():
    """Four blocks: the root and two of them gathered at once is less than all of them."""
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=4, n_head=2, batch_size=8)


@pytest.fixture(scope="module")
def peaks():
    """3 AdamW steps (the prefetch follows the first step's order from the second) of hsdp and its peer, 2 × 2."""
    return {name: run_job(make_job(deep_gpt(), name, 4, 3, "fp32", "adamw", 1e-3, 1, {"shard_group_size": 2}), 4)
            for name in ("hsdp", "fsdp2-hsdp")}


def test_the_parameters_held_at_once_are_fsdp2s(peaks):
    """The root, the block computing and one prefetched in backward, and the shards: the formula, to the byte, on
    every rank, on both (the peer's prefetched unit sits in FSDP2's all-gather output, which the peer's ledger
    reads from its parameter group; its shards are hsdp's here: every dimension even, padded alike)."""
    ours, peer = peaks["hsdp"].ranks, peaks["fsdp2-hsdp"].ranks
    expected = theory.hsdp_peak_param_bytes(_units(deep_gpt()), 2, 4)
    for rank, theirs in zip(ours, peer):
        assert rank.peak_by_category["params"] == expected, rank.rank
        assert theirs.peak_by_category["params"] == expected, theirs.rank


def test_the_peak_is_fsdp2_hsdps_at_the_same_sample_less_its_step_scalars(peaks):
    """Both ledgers sampled in backward (the peer's on FSDP2's unsharded parameters), FSDP2's own buffers read from
    its parameter groups: the peak at the same gradient, the same bytes in every category but the optimizer's,
    where the peer's AdamW keeps a step scalar per parameter and hsdp's one per unit — the formulas' step_scalars."""
    for ours, theirs in zip(peaks["hsdp"].ranks, peaks["fsdp2-hsdp"].ranks):
        assert ours.peak_where == theirs.peak_where and ours.peak_where.startswith("backward "), ours.rank
        scalars = theirs.theory_model_states["step_scalars"] - ours.theory_model_states["step_scalars"]
        assert scalars > 0
        assert {**ours.peak_breakdown, "optimizer": ours.peak_breakdown["optimizer"] + scalars} == \
            theirs.peak_breakdown, ours.rank
        assert ours.peak_bytes + scalars == theirs.peak_bytes, ours.rank


def _units(work):
    """hsdp's flat units of ``work``'s model, the root last (padding aside, each block's parameters)."""
    from zerokit.zero.units import form_units

    return [sum(p.numel() for p in spec.params) for spec in form_units(work.build_model(), "block", set())]


def _held_between_steps(ctx, name):
    """After a step and zero_grad, through the next forward: the gradient bytes the memory ledger sees."""
    from zerokit.runtime.memory import MemoryLedger

    torch.set_num_threads(1)
    work = deep_gpt()
    strategy = get_strategy(name)(work.build_model(), ctx, TrainConfig(optimizer=OptimizerSpec("sgd", lr=0.1)),
                                  shard_group_size=2)
    ledger = MemoryLedger()
    strategy.track_memory(ledger)
    x, y = work.batch(0)
    per = x.shape[0] // ctx.world_size
    x, y = x[ctx.rank * per:(ctx.rank + 1) * per], y[ctx.rank * per:(ctx.rank + 1) * per]
    strategy.backward(work.loss(strategy.forward(x), y))
    after_backward = ledger.current()["grads"]
    strategy.step()
    strategy.zero_grad()
    after_zero_grad = ledger.current()["grads"]
    loss = work.loss(strategy.forward(x), y)
    return after_backward, after_zero_grad, ledger.current()["grads"], float(loss)


def test_no_gradient_bytes_from_zero_grad_to_the_next_backward_as_fsdp2():
    """FSDP2's zero_grad(set_to_none=True) frees the gradient shards; hsdp's are allocated at a step's first
    reduce-scatter (contiguous_gradients=False), so zero_grad frees them too. After backward both hold them."""
    for name in ("hsdp", "fsdp2-hsdp"):
        for after_backward, after_zero_grad, after_forward, _ in zerokit.launch(_held_between_steps, 4, name):
            assert after_backward > 0 and (after_zero_grad, after_forward) == (0, 0), name


def _held_in_backward(ctx):
    """What a block holds when its first gradient has arrived, read in a hook that runs after hsdp's own."""
    torch.set_num_threads(1)
    work = deep_gpt()
    model = work.build_model()
    strategy = get_strategy("hsdp")(model, ctx, TrainConfig(optimizer=OptimizerSpec("sgd", lr=0.1)),
                                    shard_group_size=2)
    block = strategy.unit_of[model.blocks[-1].mlp.proj.bias]
    seen = []
    for p in block.flat.params:
        p.register_post_accumulate_grad_hook(lambda p: seen.append((block.bucket is None, p.grad is not None)))
    x, y = work.batch(0)
    per = x.shape[0] // ctx.world_size
    strategy.backward(work.loss(strategy.forward(x[ctx.rank * per:(ctx.rank + 1) * per]),
                                y[ctx.rank * per:(ctx.rank + 1) * per]))
    return seen, block.bucket is None, all(p.grad is None for p in block.flat.params)


def test_a_units_gradients_stay_in_grad_until_its_backward_is_complete():
    """FSDP2's post_backward: autograd's gradients stay until every one of the unit's is in; then its bucket is
    built, they are dropped, and it is reduce-scattered. (zero3, DeepSpeed's, copies each into the unit's bucket
    as it comes.) The hook of the unit's last parameter runs after hsdp's, which has reduce-scattered it by then."""
    for seen, freed, dropped in zerokit.launch(_held_in_backward, 4):
        assert seen[:-1] == [(True, True)] * (len(seen) - 1)
        assert freed and dropped
