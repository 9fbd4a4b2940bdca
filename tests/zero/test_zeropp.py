"""ZeRO++ (arXiv 2306.10209): the block quantizer, then qwZ, hpZ and qgZ against exact ZeRO-3."""
import pytest
import torch
import torch.distributed as dist

import zerokit
from zerokit import theory
from zerokit.cli import compare
from zerokit.job import make_job
from zerokit.optim import OptimizerSpec
from zerokit.runtime import comm
from zerokit.runtime.memory import MemoryLedger
from zerokit.runtime.nodes import RANKS_PER_NODE_ENV
from zerokit.strategies import TrainConfig, get
from zerokit.theory.zeropp import block_quantization_error_bound, quantized_bytes
from zerokit.zero.config import from_deepspeed, strategy_of
from zerokit.zero.qgz import deepspeed_quantizes, qgz_reduces_unit, quantized_reduce_scatter
from zerokit.zero.quantize import dequantize_blocks, quantize_blocks
from zerokit.zero.zeropp_accounting import measured_bytes_leaving_a_node
from zerokit.zero.zeropp_error import zeropp_loss_effect


# --- the block quantizer --------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("numel,block_size", [(1000, 64), (7, 3), (1, 5), (33, 33), (64, 16)])
def test_round_trip_is_within_half_a_scale_per_element(bits, numel, block_size):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel + bits))
    x[:block_size] = 0 if numel > block_size else x[:block_size]  # a zero block where there are two blocks
    q, scales = quantize_blocks(x, block_size, bits)
    assert q.dtype == torch.int8 and q.numel() == (numel if bits == 8 else (numel + 1) // 2)
    assert scales.numel() == -(-numel // block_size)
    assert q.numel() * q.element_size() + scales.numel() * 4 == quantized_bytes(numel, block_size, bits)
    back = dequantize_blocks(q, scales, block_size, numel, bits)
    assert torch.isfinite(back).all()
    bound = torch.tensor([block_quantization_error_bound(float(s)) for s in scales]).repeat_interleave(block_size)
    err = (x - back).abs()
    assert (err <= bound[:numel] * (1 + 2 ** -20)).all()
    if numel > block_size:
        assert (back[:block_size] == 0).all() and scales[0] == 1  # the zero block: scale 1, exact zeros
    assert err.max() > 0 or numel == 1  # the codec is lossy: the check can fail


def test_int4_packs_two_codes_per_byte_low_nibble_first():
    x = torch.tensor([1.0, -7.0, 7.0, 0.0, -1.0])  # block of 5, absmax 7 → scale 1 → codes equal x
    q, scales = quantize_blocks(x, 5, bits=4)
    assert scales.tolist() == [1.0]
    assert q.view(torch.uint8).tolist() == [0x1 | (0x9 << 4), 0x7 | (0x0 << 4), 0xF]
    assert dequantize_blocks(q, scales, 5, 5, bits=4).tolist() == x.tolist()


def test_bf16_input_is_quantized_in_float32_and_returned_as_asked():
    x = torch.randn(50, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q, scales = quantize_blocks(x, 8)
    back = dequantize_blocks(q, scales, 8, 50, dtype=torch.bfloat16)
    assert back.dtype == torch.bfloat16 and scales.dtype == torch.float32
    bound = scales.repeat_interleave(8)[:50] / 2 + x.float().abs() * 2 ** -8  # + half a bf16 ulp of the value
    assert ((x.float() - back.float()).abs() <= bound).all()


@pytest.mark.parametrize("kwargs,name", [(dict(block_size=0), "block_size"), (dict(block_size=2.0), "block_size"),
                                         (dict(bits=3), "bits"), (dict(bits=True), "bits"),
                                         (dict(x=torch.arange(4)), "x")])
def test_bad_input_names_the_argument(kwargs, name):
    args = dict(x=torch.randn(4), block_size=2, bits=8) | kwargs
    with pytest.raises(ValueError, match=name):
        quantize_blocks(**args)


# --- qgZ's two hops, on their own ----------------------------------------------------------------


LR = 0.1
BLOCK = 64
ALL_THREE = dict(zero_quantized_weights=True, zero_quantized_gradients=True, quantization_block_size=BLOCK)


def _probe_qgz(ctx) -> dict:
    """The collective alone: an input exact on every int4 grid (the sum comes back exactly, so a misplaced slice
    shows), then random inputs against the proved bound."""
    intra, inter = ctx.mesh.node_groups()
    g, n, c, block = ctx.mesh.ranks_per_node, ctx.world_size, 40, 16
    codes = torch.arange(n * c) % 15 - 7
    codes[::8] = 7  # every block (and every short last block of 8) holds the largest code: scale 2^-4 exactly
    grid = codes.float() / 16
    out = torch.empty(c)
    quantized_reduce_scatter(out, grid.clone(), intra, inter, g, block, 4, "probe exact")
    exact = torch.equal(out, n * grid[ctx.rank * c:(ctx.rank + 1) * c])
    x = torch.randn(n * c, generator=torch.Generator().manual_seed(ctx.rank))
    quantized_reduce_scatter(out, x.clone(), intra, inter, g, block, 4, "probe random")
    total, absmax = x.double(), x.abs().max().reshape(1)
    dist.all_reduce(total)
    dist.all_reduce(absmax, op=dist.ReduceOp.MAX)
    error = float((out.double() - total[ctx.rank * c:(ctx.rank + 1) * c]).abs().max())
    return {"exact": exact, "error": error, "absmax": float(absmax), "g": g, "nodes": n // g}


# --- training: every configuration in one launch --------------------------------------------------

def _work(batch_size=12):
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=batch_size,
                            tie_weights=True)


def _model(work, dtype):
    model = work.build_model().to(dtype)
    model.pos.weight.requires_grad_(False)  # a frozen parameter: held whole, never gathered
    return model


def _local(work, ctx, step):
    x, y = work.batch(step)
    per = x.shape[0] // ctx.world_size
    return x[ctx.rank * per:(ctx.rank + 1) * per], y[ctx.rank * per:(ctx.rank + 1) * per]


def _train(ctx, work, name, options, steps, precision, micro_batches=1):
    dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float32
    model = _model(work, dtype)
    if name == "zeropp":  # the tallies read below: measured (off by default)
        options = dict(options, measure_quantization_error=True)
    config = TrainConfig(precision, OptimizerSpec("sgd", lr=LR), micro_batches=micro_batches)
    strategy = get(name)(model, ctx, config, **options)
    memory = MemoryLedger()
    strategy.track_memory(memory)
    ledger = comm.ledger()
    ledger.reset()
    losses, params, tallies = [], [], []
    for step in range(steps):
        comm.set_step(step)
        strategy.zero_grad()
        x, y = _local(work, ctx, step)
        step_loss = 0.0
        for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            with comm.phase("forward"):
                loss = work.loss(strategy.forward(xm), ym) / micro_batches
            with comm.phase("backward"):
                strategy.backward(loss)
            step_loss += float(loss.detach())
        with comm.phase("step"):
            strategy.step()
        losses.append(step_loss)
        if name == "zeropp":
            tallies.append((strategy.weight_error.take(), strategy.gradient_error.take()))
        with comm.phase("setup"):
            whole = strategy.full_parameters()
        params.append(whole if ctx.rank == 0 else None)
    measured = {axis: row["ring_cost_bytes"] / steps for axis, row in ledger.by_axis().items()}
    rows = {(row["axis"], row["op"], row["phase"]): row["ring_cost_bytes"] / steps for row in ledger.summary()}
    notes = sorted({r.note for r in ledger.records if r.note})  # the strategy's own notes (comm.note)
    summary_notes = [row["note"] for row in ledger.summary() if row["op"] == "reduce_scatter"]
    psi = sum(p.numel() for p in model.parameters())
    out = {"losses": losses, "params": params, "measured_by_axis": measured, "tallies": tallies,
           "measured_params_bytes": memory.current()["params"], "measured_rows": rows, "notes": notes,
           "summary_notes": summary_notes,
           "reduced_by": [("qgz" if any(r.tag == f"grads {u.label} inter-node" for r in ledger.records) else "rs")
                          for u in strategy.units]}
    if name == "zeropp":
        out["measured_leaving_node"] = measured_bytes_leaving_a_node(ledger.summary(), steps, ctx.world_size,
                                                                     strategy.ranks_per_node, strategy.hpz_size)
        out.update(theory_by_axis=strategy.theory_comm_bytes_by_axis(),
                   theory_secondary_bytes=strategy.theory_secondary_bytes(),
                   theory_leaving_node=strategy.theory_bytes_leaving_a_node(), qgz_units=strategy.qgz_units)
        names = {p: n for n, p in model.named_parameters()}
        out["fallback_params"] = [names[p] for u, flag in zip(strategy.units, strategy.qgz_units) if not flag
                                  for p in u.flat.params]
    else:
        out["theory_by_axis"] = {"dp": strategy.theory_comm_bytes(psi)}
    return out


def _run(ctx, configs, steps, precision):
    """Each config ``(label, strategy, options[, micro-batches])``; with A micro-batches a global batch of 8A
    (A = 1: the usual 12)."""
    torch.set_num_threads(1)
    out = {"probe": _probe_qgz(ctx)}
    for label, name, options, *a in configs:
        a = a[0] if a else 1
        out[label] = _train(ctx, _work(12 if a == 1 else 8 * a), name, options, steps, precision, a)
    return out


def _launch(monkeypatch, world, ranks_per_node, configs, steps=2, precision="fp32"):
    monkeypatch.setenv(RANKS_PER_NODE_ENV, str(ranks_per_node))
    return zerokit.launch(_run, world, configs, steps, precision)


def _reference_gradient_and_absmax(world):
    """One process: the full step-0 gradient's 1-norm, and the largest |gradient/N| any rank's bucket holds."""
    work = _work()
    model = _model(work, torch.float32)
    x, y = work.batch(0)
    work.loss(model(x), y).backward()
    l1 = sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None)
    absmax, per = 0.0, x.shape[0] // world
    for r in range(world):
        model.zero_grad()
        work.loss(model(x[r * per:(r + 1) * per]), y[r * per:(r + 1) * per]).backward()
        absmax = max(absmax, max(float(p.grad.abs().max()) / world for p in model.parameters() if p.grad is not None))
    return l1, absmax


def _max_diff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _check_ledger(result):
    """The ledger per axis equals the formula per axis, to the byte; the secondary copy's bytes too."""
    assert result["measured_by_axis"] == pytest.approx(result["theory_by_axis"], abs=0), result
    for weights, gradients in result["tallies"]:
        assert weights["over_bound"] == 0 and gradients["over_bound"] == 0


@pytest.fixture(scope="module")
def four_ranks_two_nodes():
    mp = pytest.MonkeyPatch()
    try:
        yield _launch(mp, 4, 2, [
            ("zero3", "zero3", {}),
            ("off", "zeropp", {}),
            ("hpz", "zeropp", dict(zero_hpz_partition_size=2)),
            ("qwz", "zeropp", dict(zero_quantized_weights=True, quantization_block_size=BLOCK)),
            ("qgz", "zeropp", dict(zero_quantized_gradients=True, quantization_block_size=BLOCK)),
            ("all", "zeropp", dict(ALL_THREE, zero_hpz_partition_size=2)),
            ("zero3 A=2", "zero3", {}, 2),
            ("hpz A=2", "zeropp", dict(zero_hpz_partition_size=2), 2),
            ("all A=2", "zeropp", dict(ALL_THREE, zero_hpz_partition_size=2), 2),
            ("zero3 per module", "zero3", dict(unit_size=0)),
            ("qgz per module", "zeropp", dict(zero_quantized_gradients=True, quantization_block_size=BLOCK,
                                              unit_size=0)),
        ])
    finally:
        mp.undo()


def test_qgz_two_hops_sum_exactly_on_the_grid_and_within_the_bound(four_ranks_two_nodes):
    for rank in four_ranks_two_nodes:
        probe = rank["probe"]
        assert (probe["g"], probe["nodes"]) == (2, 2)
        assert probe["exact"], "a slice landed on the wrong owner"
        bound = theory.qgz_error_bound(probe["absmax"], 2, 2, 4)
        assert 0 < probe["error"] <= bound * (1 + 1e-6)


def test_all_off_and_hpz_alone_are_zero3_bit_for_bit(four_ranks_two_nodes):
    zero3 = four_ranks_two_nodes[0]["zero3"]
    for label in ("off", "hpz"):
        run = four_ranks_two_nodes[0][label]
        assert run["losses"] == zero3["losses"], label
        for mine, theirs in zip(run["params"], zero3["params"]):
            assert _max_diff(mine, theirs) == 0, label
    assert four_ranks_two_nodes[0]["off"]["measured_by_axis"] == zero3["measured_by_axis"]


def test_qwz_forward_loss_lies_within_the_first_order_bound_of_exact(four_ranks_two_nodes):
    """Every weight is off by ≤ scale/2 ≤ max_bound, so |L(ŵ) − L(w)| ≤ ‖∇L‖₁·max_bound to first order;
    the second-order remainder (weights off by < 1 %) is allowed a factor 2. Loose (every error aligned
    with its gradient): measured 1e-4 against 0.6; a misplaced chunk moves the loss by far more."""
    l1, _ = _reference_gradient_and_absmax(4)
    for label in ("qwz", "all"):
        runs = [rank[label] for rank in four_ranks_two_nodes]
        zero3 = sum(rank["zero3"]["losses"][0] for rank in four_ranks_two_nodes) / 4
        mine = sum(run["losses"][0] for run in runs) / 4
        max_bound = max(run["tallies"][0][0]["max_bound"] for run in runs)
        assert max_bound > 0
        assert 0 < abs(mine - zero3) <= 2 * l1 * max_bound, label


def test_qgz_first_step_moves_weights_by_at_most_lr_times_its_bound(four_ranks_two_nodes):
    """qgZ leaves forward and backward exact (the step-0 loss is zero3's, bit for bit); the first SGD step then
    differs by lr·(ĝ − g), each element within lr·qgz_error_bound."""
    _, absmax = _reference_gradient_and_absmax(4)
    run, zero3 = four_ranks_two_nodes[0]["qgz"], four_ranks_two_nodes[0]["zero3"]
    assert run["losses"][0] == zero3["losses"][0]
    bound = LR * theory.qgz_error_bound(absmax, 2, 2, 4)
    assert 0 < _max_diff(run["params"][0], zero3["params"][0]) <= bound * (1 + 1e-3)


def test_ledger_per_axis_equals_the_formulas_to_the_byte_at_four_ranks(four_ranks_two_nodes):
    rank = four_ranks_two_nodes[0]
    assert set(rank["all"]["measured_by_axis"]) == {"dp", "hpz", "node", "inter_node"}
    for label in ("off", "hpz", "qwz", "qgz", "all"):
        _check_ledger(rank[label])
    assert rank["zero3"]["measured_by_axis"] == rank["zero3"]["theory_by_axis"]
    for label in ("hpz", "all"):
        extra = rank[label]["measured_params_bytes"] - rank["zero3"]["measured_params_bytes"]
        assert extra == rank[label]["theory_secondary_bytes"] > 0, label
    for label in ("off", "hpz", "qwz", "qgz", "all"):  # the paper's cross-node terms, ledger and formula
        assert rank[label]["measured_leaving_node"] == rank[label]["theory_leaving_node"], label
    leaving, zero3 = rank["all"]["theory_leaving_node"], rank["off"]["theory_leaving_node"]
    assert leaving["backward_all_gather"] == 0 and leaving["gradient_reduce_scatter"] > 0
    assert sum(leaving.values()) < 0.3 * sum(zero3.values())  # 3M → 0.75M, plus scales and (n−1)/n


def test_hpz_under_accumulation_gathers_over_dp_once_per_step_as_deepspeed(four_ranks_two_nodes):
    """4 ranks as 2 nodes, s = 2 (the hpz group is a node, not dp): at A = 2 the step's first forward gathers over
    dp and fills the secondary copy; micro-batch 2's forward gathers from it, inside the node. The global gathers
    per step are A = 1's, the hpz ones 2A − 1 = 3 times A = 1's; ledger = formula to the byte, per axis and per
    phase; and the values are ZeRO-3's, bit for bit."""
    rank = four_ranks_two_nodes[0]
    for label in ("hpz", "all"):
        one, two = rank[label]["measured_rows"], rank[f"{label} A=2"]["measured_rows"]
        assert two[("dp", "all_gather", "forward")] == one[("dp", "all_gather", "forward")] > 0, label
        assert ("dp", "all_gather", "backward") not in two, label
        assert ("hpz", "all_gather", "forward") not in one, label
        assert two[("hpz", "all_gather", "forward")] == one[("hpz", "all_gather", "backward")], label
        assert two[("hpz", "all_gather", "backward")] == 2 * one[("hpz", "all_gather", "backward")], label
        _check_ledger(rank[f"{label} A=2"])
        assert rank[f"{label} A=2"]["measured_leaving_node"] == rank[f"{label} A=2"]["theory_leaving_node"], label
        # with s = g, what leaves a node for the weights is the step's one global gather, whatever A
        assert rank[f"{label} A=2"]["theory_leaving_node"]["forward_all_gather"] == \
            rank[label]["theory_leaving_node"]["forward_all_gather"] > 0, label
    zero3 = rank["zero3 A=2"]
    assert rank["zero3 A=2"]["measured_by_axis"] == rank["zero3 A=2"]["theory_by_axis"]
    assert rank["hpz A=2"]["losses"] == zero3["losses"]
    for mine, theirs in zip(rank["hpz A=2"]["params"], zero3["params"]):
        assert _max_diff(mine, theirs) == 0


def test_qgz_falls_back_per_unit_where_deepspeed_reduce_scatters(four_ranks_two_nodes):
    """Every module its own unit: the LayerNorms' units (1-D gradients only) are reduce-scattered exactly, the
    Linear and embedding units go through qgZ; the ledger equals the formula with those flags, the fallback
    rows carry the note, and after the first step the fallback units' weights are ZeRO-3's bit for bit."""
    rank = four_ranks_two_nodes[0]
    run, zero3 = rank["qgz per module"], rank["zero3 per module"]
    assert run["reduced_by"] == ["qgz" if flag else "rs" for flag in run["qgz_units"]]
    assert "rs" in run["reduced_by"] and "qgz" in run["reduced_by"]
    _check_ledger(run)
    assert run["measured_leaving_node"] == run["theory_leaving_node"]
    assert run["notes"] and all("qgZ fell back to the exact reduce-scatter" in n and "2N = 8" in n
                                for n in run["notes"])
    assert rank["qgz"]["notes"] == [] and rank["zero3"]["notes"] == []  # every unit quantized: no note
    fallback = [name for name in run["fallback_params"]]
    assert fallback and all(name.rsplit(".", 1)[-1] in ("weight", "bias") for name in fallback)
    for name in fallback:  # reduce-scattered exactly: the first SGD step is ZeRO-3's, bit for bit
        assert torch.equal(run["params"][0][name], zero3["params"][0][name]), name
    quantized = set(run["params"][0]) - set(fallback) - {"pos.weight"}
    assert max(float((run["params"][0][n] - zero3["params"][0][n]).abs().max()) for n in quantized) > 0


def test_deepspeeds_qgz_rule_per_gradient_and_zerokits_per_unit():
    """all_to_all_quant_reduce: a 1-D gradient, or one whose numel 2N does not divide, is reduce-scattered."""
    assert deepspeed_quantizes((4, 8), 4) and deepspeed_quantizes((2, 2, 2), 4)
    assert not deepspeed_quantizes((64,), 4)  # 1-D, though 64 divides by 8
    assert not deepspeed_quantizes((3, 5), 4)  # 15 elements: not a multiple of 2N = 8
    assert not deepspeed_quantizes((), 1)  # a scalar: numel 1
    bias, weight = torch.zeros(8), torch.zeros(4, 8)
    assert qgz_reduces_unit([bias, weight], 4) and not qgz_reduces_unit([bias, torch.zeros(3, 5)], 4)
    with pytest.raises(ValueError, match="world"):
        deepspeed_quantizes((4, 8), 0)


def test_the_loss_effect_runs_both_in_one_launch():
    effect = zeropp_loss_effect(_work(), world_size=2, steps=3, ranks_per_node=1, optimizer="sgd", lr=LR)
    assert len(effect["losses"]["zero3"]) == len(effect["losses"]["zeropp"]) == 3
    assert effect["loss_difference"][0] != 0
    for step in effect["weight_error"] + effect["gradient_error"]:
        assert step["over_bound"] == 0 and 0 < step["max_abs"] <= step["max_bound"] * (1 + 2 ** -20)
    with pytest.raises(ValueError, match="ranks_per_node"):
        zeropp_loss_effect(_work(), world_size=2, steps=1, ranks_per_node=3)


@pytest.fixture(scope="module")
def three_ranks_three_nodes():
    mp = pytest.MonkeyPatch()
    try:
        yield _launch(mp, 3, 1, [("zero3", "zero3", {}), ("off", "zeropp", dict(zero_hpz_partition_size=1)),
                                 ("all", "zeropp", dict(ALL_THREE, zero_hpz_partition_size=3))])
    finally:
        mp.undo()


def test_an_odd_world_of_three_nodes_runs_qgz_on_its_inter_node_hop_alone(three_ranks_three_nodes):
    rank = three_ranks_three_nodes[0]
    probe = rank["probe"]
    assert (probe["g"], probe["nodes"]) == (1, 3) and probe["exact"]
    assert 0 < probe["error"] <= theory.qgz_error_bound(probe["absmax"], 1, 3, 4) * (1 + 1e-6)
    assert rank["off"]["losses"] == rank["zero3"]["losses"]
    assert set(rank["all"]["measured_by_axis"]) == {"dp", "hpz", "inter_node"}  # a node of one rank: no first hop
    _check_ledger(rank["all"])
    assert rank["all"]["measured_params_bytes"] - rank["zero3"]["measured_params_bytes"] == \
        rank["all"]["theory_secondary_bytes"]
    assert rank["all"]["theory_leaving_node"]["backward_all_gather"] > 0  # s = 3 spans the three nodes


@pytest.fixture(scope="module")
def two_ranks_bf16():
    mp = pytest.MonkeyPatch()
    try:
        yield _launch(mp, 2, 2, [("zero3", "zero3", {}), ("off", "zeropp", {}),
                                 ("qgz", "zeropp", dict(zero_quantized_gradients=True)),
                                 ("all", "zeropp", dict(ALL_THREE, zero_hpz_partition_size=2, gradient_bits=8))],
                      precision="bf16-mixed")
    finally:
        mp.undo()


def test_bf16_on_one_node_of_two(two_ranks_bf16):
    rank = two_ranks_bf16[0]
    probe = rank["probe"]
    assert (probe["g"], probe["nodes"]) == (2, 1) and probe["exact"]
    assert rank["off"]["losses"] == rank["zero3"]["losses"]
    assert set(rank["all"]["measured_by_axis"]) == {"dp", "hpz"}  # one node: DeepSpeed runs no qgZ
    _check_ledger(rank["all"])
    assert rank["all"]["tallies"][0][0]["max_abs"] > 0
    assert rank["all"]["theory_leaving_node"] == {"forward_all_gather": 0, "backward_all_gather": 0,
                                                  "gradient_reduce_scatter": 0}
    assert abs(rank["all"]["losses"][0] - rank["zero3"]["losses"][0]) < 0.05  # bf16 weights, int8 blocks


def test_qgz_on_one_node_is_zero3s_reduce_scatter_with_a_note(two_ranks_bf16):
    """DeepSpeed runs qgZ only when the ranks span nodes: on one node of two, zero_quantized_gradients leaves
    ZeRO-3's reduce-scatter — its bytes and its results, bit for bit — and the ledger's note says why."""
    rank = two_ranks_bf16[0]
    qgz, zero3 = rank["qgz"], rank["zero3"]
    assert qgz["measured_rows"] == zero3["measured_rows"]
    assert qgz["theory_by_axis"] == qgz["measured_by_axis"] == zero3["measured_by_axis"]
    assert qgz["losses"] == zero3["losses"]
    for mine, theirs in zip(qgz["params"], zero3["params"]):
        assert _max_diff(mine, theirs) == 0
    assert qgz["tallies"][0][1]["max_abs"] == 0  # no gradient was quantized
    assert len(qgz["notes"]) == 1 and "qgZ did not run: the 2 ranks are one node" in qgz["notes"][0]
    assert zero3["notes"] == []
    assert all(qgz["notes"][0] in note for note in qgz["summary_notes"])  # the rows a result's notes come from


# --- options and config ----------------------------------------------------------------------------

@pytest.mark.parametrize("options,name", [(dict(zero_hpz_partition_size=0), "zero_hpz_partition_size"),
                                          (dict(gradient_bits=2), "gradient_bits"),
                                          (dict(quantization_block_size=0), "quantization_block_size"),
                                          (dict(zero_quantized_weights=1), "zero_quantized_weights"),
                                          (dict(algorithm="ring"), "algorithm"),
                                          (dict(offload="optimizer"), "offload")])
def test_bad_options_are_refused_before_any_process_starts(options, name):
    with pytest.raises(ValueError, match=name):
        get("zeropp").resolve_options(options)


def test_an_hpz_partition_that_does_not_divide_dp_is_refused():
    with pytest.raises(ValueError, match="zero_hpz_partition_size=2 must divide the 3"):
        make_job(_work(), "zeropp", 3, 1, "fp32", "sgd", LR, 1, {"zero_hpz_partition_size": 2})
    ctx = zerokit.RankContext(0, 1, torch.device("cpu"), "none")
    with pytest.raises(ValueError, match="zero_hpz_partition_size=2 must divide"):
        get("zeropp")(_model(_work(), torch.float32), ctx, TrainConfig(optimizer=OptimizerSpec("sgd", lr=LR)),
                      zero_hpz_partition_size=2)


def test_deepspeed_config_keys_select_zeropp():
    zero = {"stage": 3, "zero_quantized_weights": True, "zero_hpz_partition_size": 8,
            "zero_quantized_gradients": True}
    options = from_deepspeed({"zero_optimization": zero})
    assert strategy_of(3, options) == "zeropp" and strategy_of(3, {}) == "zero3"
    assert get("zeropp").resolve_options(options)["zero_hpz_partition_size"] == 8
    with pytest.raises(ValueError, match="contradicts stage 2"):
        from_deepspeed({"zero_optimization": {"stage": 2, "zero_quantized_weights": True}})
    with pytest.raises(ValueError, match="zero_quantized_nontrainable_weights"):
        from_deepspeed({"zero_optimization": {"stage": 3, "zero_quantized_nontrainable_weights": True}})
    with pytest.raises(ValueError, match="zero_hpz_partition_size"):
        from_deepspeed({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 0}})


# --- the DeepSpeed peer ----------------------------------------------------------------------------

def test_deepspeed_hpz_trains_like_zeropp_hpz(monkeypatch):
    """4 ranks as 2 nodes of 2, s = 2: the hpZ group is a node, not the whole dp group; 2 micro-batches, so
    the second one's forward reads the secondary copy in both."""
    pytest.importorskip("deepspeed")
    monkeypatch.setenv(RANKS_PER_NODE_ENV, "2")
    options = {"zero_hpz_partition_size": 2}
    report = compare(_work(16), 4, ["zeropp", "deepspeed-zeropp"], steps=2, optimizer="sgd", lr=LR,
                     micro_batches=2, options_for=lambda name: options)
    ours = report["zeropp"].ranks[0]
    assert ours.coords is not None and set(ours.comm_bytes_by_axis) == {"dp", "hpz"}
    assert ours.comm_bytes_by_axis["hpz"]["ring_cost_bytes"] > 0
    assert report["deepspeed-zeropp"].ranks[0].losses == pytest.approx(ours.losses, abs=1e-5)


def test_the_deepspeed_peers_formula_counts_the_nodes(monkeypatch):
    """deepspeed-zeropp's formula on 4 ranks: qgZ's two hops on 2 nodes of 2, none on one node of 4 (Ψ = 400:
    C = 100, so that the scales of qgZ's hops differ between 4 nodes of 1 and 2 nodes of 2: 162 B vs 158 B)."""
    from zerokit.peers.deepspeed import DeepSpeedZeroPlusPlus

    psi, b = 400, theory.param_bytes_per_element("bf16-mixed")
    peer = DeepSpeedZeroPlusPlus.__new__(DeepSpeedZeroPlusPlus)  # the formula alone: no DeepSpeed engine
    peer.config = TrainConfig("bf16-mixed", OptimizerSpec("sgd", lr=LR))
    peer.opts = dict(zero_quantized_weights=True, zero_hpz_partition_size=2, zero_quantized_gradients=True)

    def formula(g):
        by = theory.zeropp_collective_bytes([psi], 4, b, ranks_per_node=g, hpz_partition_size=2,
                                            quantized_weights=True, quantized_gradients=True)
        return sum(sum(ops.values()) for ops in by.values())

    assert len({formula(1), formula(2), formula(4)}) == 3
    for per_node in (2, 4):
        monkeypatch.setenv(RANKS_PER_NODE_ENV, str(per_node))
        peer.ctx = zerokit.RankContext(0, 4, torch.device("cpu"), "none")
        assert peer.theory_comm_bytes(psi) == formula(per_node), per_node
