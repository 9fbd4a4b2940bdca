"""Context parallelism's attention on real ranks: ring attention and Ulysses against one process's causal attention
(forward and every gradient), the zig-zag layout's balance, and the bytes on the cp axis against the theory."""
import pytest
import torch
import torch.nn.functional as F

import zerokit
from zerokit import theory
from zerokit.context_parallel import ATTENTION, layout
from zerokit.runtime import comm

B, H, T, D = 2, 4, 24, 8


def _inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    dout = torch.randn(B, H, T, D, generator=g)
    return q, k, v, dout


def _attend(ctx, kind):
    """This rank's tokens through ``kind``; the outputs and gradients, gathered back into sequence order."""
    import torch.distributed as dist

    cp, r = ctx.world_size, ctx.rank
    q, k, v, dout = _inputs()
    mine = [layout.split(t, r, cp, dim=2).clone().requires_grad_(t is not dout) for t in (q, k, v, dout)]
    positions = layout.positions(r, cp, T)
    all_positions = torch.stack([layout.positions(i, cp, T) for i in range(cp)])
    ledger = comm.ledger()
    ledger.reset()
    with comm.phase("forward"):
        out = ATTENTION[kind](*mine[:3], positions, all_positions, None)
    with comm.phase("backward"):
        out.backward(mine[3])
    sent = {ph: sum(rec.ring_cost_bytes for rec in ledger.records if rec.phase == ph) for ph in ("forward", "backward")}
    pieces = []
    for t in (out.detach(), mine[0].grad, mine[1].grad, mine[2].grad):
        parts = [torch.empty_like(t) for _ in range(cp)]
        dist.all_gather(parts, t.contiguous())
        pieces.append(layout.gather(parts, dim=2))
    return pieces, sent, mine[1].numel() * mine[1].element_size()


def _reference():
    q, k, v, dout = (t.clone().requires_grad_(True) for t in _inputs())
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.mark.parametrize("cp", [2, 3])
def test_ring_attention_and_ulysses_equal_one_process(cp):
    if cp == 3 and H % 3:  # Ulysses splits heads; 4 heads do not split over 3 ranks: the ring alone at cp = 3
        kinds = ["ring"]
    else:
        kinds = ["ring", "ulysses"]
    reference = _reference()
    for kind in kinds:
        ranks = zerokit.launch(_attend, cp, kind)
        for pieces, sent, block in ranks:
            # fp32: the same sums in another order (blocks merged by log-sum-exp), a few ulps of values near 1
            for ours, theirs, name in zip(pieces, reference, ("out", "dq", "dk", "dv")):
                assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5), (kind, name, (ours - theirs).abs().max())
            formula = (theory.ring_attention_bytes if kind == "ring" else theory.ulysses_bytes)(cp, block)
            assert sent == formula, (kind, sent, formula)


def test_ulysses_refuses_heads_that_do_not_split():
    with pytest.raises(Exception, match="do not divide over cp = 3"):
        zerokit.launch(_attend, 3, "ulysses")


def test_the_zigzag_layout_balances_the_causal_work():
    cp, t = 4, 64
    zig = [layout.causal_pairs(r, cp, t) for r in range(cp)]
    flat = [layout.causal_pairs(r, cp, t, zigzag=False) for r in range(cp)]
    assert len(set(zig)) == 1 and sum(zig) == sum(flat) == t * (t + 1) // 2
    assert flat[-1] / flat[0] == pytest.approx((2 * cp - 1), rel=0.2)  # contiguous: the last rank ~2cp−1 × the first
    x = torch.arange(t).view(1, t)
    assert torch.equal(layout.gather([layout.split(x, r, cp) for r in range(cp)]), x)
    with pytest.raises(ValueError, match="multiple of 2·cp"):
        layout.check(30, 4)


# -- inside zerokit.train: the tiny GPT's sequence cut over cp, against one process ------------------------------
def _gpt():
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8, tie_weights=True)


@pytest.mark.parametrize("attention,parallel,strategy", [("ring", {"cp": 2}, "ddp"), ("ulysses", {"cp": 2}, "ddp"),
                                                         ("ring", {"dp": 2, "cp": 2}, "zero3")])
def test_the_tiny_gpt_under_context_parallelism_trains_like_one_process(attention, parallel, strategy):
    from zerokit.cli import compare

    world = parallel.get("dp", 1) * parallel["cp"]
    report = compare(_gpt(), world, ["single", strategy], steps=3, optimizer="sgd", lr=0.1, parallel=parallel,
                     options_for=lambda name: {"cp_attention": attention} if name == strategy else {})
    result = report[strategy]
    assert result.param_diff["max_abs"] <= 1e-5, result.param_diff  # fp32: sums in another order
    assert result.losses == pytest.approx(report["single"].losses, abs=1e-5)
    for rank in result.ranks:
        measured = {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items()}
        # the sequence's attention on cp, the gradients on the flattened dp × cp group: each = its formula
        assert measured == pytest.approx(rank.theory_comm_bytes_by_axis, abs=0.5), (measured,
                                                                                     rank.theory_comm_bytes_by_axis)
        assert set(measured) == {"cp", "dp_cp"}
    # `zerokit compare` prints them next to the theory
    assert f"by axis, {strategy} rank 0, B/step measured / theory: cp " in report.table()


@pytest.mark.parametrize("attention,strategy", [("ring", "ddp"), ("ulysses", "zero3")])
def test_a_cp_by_tp_grid_trains_like_one_process(attention, strategy):
    """cp=2 × tp=2 (4 ranks): tensor parallelism takes half the heads, the cp ranks of each tp rank attend over the
    sequence on those heads; the tp ranks' cp groups are disjoint, so each moves half the cp=2 run's bytes."""
    from zerokit.cli import compare

    gpt = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=4, batch_size=4, tie_weights=True)
    report = compare(gpt, 4, ["single", strategy], steps=3, optimizer="sgd", lr=0.1, parallel={"cp": 2, "tp": 2},
                     options_for=lambda name: {"cp_attention": attention} if name == strategy else {})
    result = report[strategy]
    assert result.param_diff["max_abs"] <= 1e-5, result.param_diff
    assert result.losses == pytest.approx(report["single"].losses, abs=1e-5)
    block = 4 * 2 * 8 * 8 * 4  # one micro-batch's K on a rank: 4 sequences × 2 of 4 heads × 8 of 16 tokens × 8 × fp32
    formula = theory.ring_attention_bytes if attention == "ring" else theory.ulysses_bytes
    for rank in result.ranks:
        measured = {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items()}
        assert set(measured) == {"cp", "dp_cp", "tp"}
        assert measured == pytest.approx(rank.theory_comm_bytes_by_axis, abs=0.5)
        assert measured["cp"] == 2 * sum(formula(2, block).values())  # two layers


@pytest.mark.parametrize("parallel,attention,strategy", [({"cp": 2}, "ring", "ddp"),
                                                         ({"cp": 2, "tp": 2}, "ulysses", "zero1")])
def test_a_mixture_of_experts_under_context_parallelism_trains_like_one_process(parallel, attention, strategy):
    """The load-balancing loss's f_e and P_e are per whole sequence: each cp rank holds chunks of it, so they are
    summed over cp (forward, and the probability mass's gradient backward); 2 accumulated micro-batches."""
    from zerokit.cli import compare

    moe = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=4, batch_size=8, n_experts=4, top_k=2)
    world = parallel["cp"] * parallel.get("tp", 1)
    report = compare(moe, world, ["single", strategy], steps=3, optimizer="sgd", lr=0.1, parallel=parallel,
                     micro_batches=2, keep_records=True,
                     options_for=lambda name: {"cp_attention": attention} if name == strategy else {})
    result = report[strategy]
    assert result.param_diff["max_abs"] <= 1e-5, result.param_diff
    assert result.losses == pytest.approx(report["single"].losses, abs=1e-5)
    aux = 2 * 2 * theory.moe_aux_cp_bytes(8 // 2, 4, 2)  # per step: 2 layers × 2 micro-batches of 4 sequences
    for rank in result.ranks:
        measured = {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items()}
        assert measured == pytest.approx(rank.theory_comm_bytes_by_axis, abs=0.5)
        aux_records = [r for r in rank.comm_records if r["tag"].startswith("moe aux") and r["phase"] != "setup"]
        assert sum(r["ring_cost_bytes"] for r in aux_records) == aux * 3 and {r["axis"] for r in aux_records} == {"cp"}
    with pytest.raises(ValueError, match="cp with dropless experts only"):
        zerokit.train(zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=4, batch_size=8,
                                       n_experts=4, top_k=2, capacity_factor=1.0), "ddp", world_size=2, steps=1,
                      parallel={"cp": 2})


def test_ring_transfers_travel_while_a_block_is_computed():
    """The timeline's order of marks on each rank (not a duration): every K/V transfer of forward and backward, and
    every dK/dV hop but the last, is posted before a block's compute and waited after it; the last hop home has
    nothing left to hide behind. timeline.overlap sums what the blocks covered."""
    from zerokit.runtime import timeline

    cp = 3
    gpt = zerokit.tiny_gpt(vocab=64, seq_len=24, d_model=32, n_layer=2, n_head=2, batch_size=4)
    report = zerokit.train(gpt, "ddp", world_size=cp, steps=1, optimizer="sgd", parallel={"cp": cp},
                           keep_records=True, reference=False)
    for rank in report.results[0].ranks:
        line = timeline.rank_timeline(rank)
        blocks = [m for m in line["modules"] if m["kind"] == "block"]
        assert len(blocks) == 2 * 2 * cp  # 2 layers × (forward + backward) × cp blocks
        ring = [c for c in line["comm"] if c["tag"].startswith("ring attention") and c["phase"] != "setup"]
        assert len(ring) == 2 * 2 * ((cp - 1) + (cp - 1) + cp)  # send + receive × layers × (kv fwd, kv bwd, dkv)
        for c in ring:
            covered = [b for b in blocks if c["start"] <= b["start"] and b["end"] <= c["blocked_start"]]
            assert bool(covered) == (c["tag"] != f"ring attention dkv {cp - 1}"), c
        measured = timeline.overlap(rank, "ring attention")
        assert measured["transfers"] == len(ring) and measured["computing_s"] > 0


def test_context_parallel_settings_are_checked_before_any_process_starts():
    with pytest.raises(ValueError, match="applies only with context parallelism"):
        zerokit.train(_gpt(), "ddp", world_size=2, steps=1, cp_attention="ring")
    with pytest.raises(ValueError, match="cp_attention='flash'; allowed"):
        zerokit.train(_gpt(), "ddp", world_size=2, steps=1, parallel={"cp": 2}, cp_attention="flash")
    with pytest.raises(ValueError, match="splits the heads over cp = 4"):
        zerokit.train(_gpt(), "ddp", world_size=4, steps=1, parallel={"cp": 4}, cp_attention="ulysses")
    with pytest.raises(ValueError, match="composes with dp and tp only so far; use pp=1"):
        zerokit.train(_gpt(), "ddp", world_size=4, steps=1, parallel={"cp": 2, "pp": 2})
    with pytest.raises(ValueError, match="after tp = 2 took its share"):  # 2 heads: 1 per tp rank, not 2 for cp
        zerokit.train(_gpt(), "ddp", world_size=4, steps=1, parallel={"cp": 2, "tp": 2}, cp_attention="ulysses")
    with pytest.raises(ValueError, match="sequence_parallel=True with cp=2"):
        zerokit.train(_gpt(), "ddp", world_size=4, steps=1, parallel={"cp": 2, "tp": 2}, sequence_parallel=True)
    with pytest.raises(ValueError, match="context parallelism .the sequence cut over ranks., which strategy .torch-ddp. does not"):
        zerokit.train(_gpt(), "torch-ddp", world_size=2, steps=1, parallel={"cp": 2})


def test_activations_per_rank_halve_at_cp_2():
    """What autograd keeps for backward, measured by the memory ledger at the peak: every token-wise layer's share
    halves exactly at cp = 2; attention keeps a little more than half (its log-sum-exp in fp32 and the positions of
    the cp ranks' tokens) — at most a tenth of the whole here."""
    work = zerokit.tiny_gpt(vocab=64, seq_len=32, d_model=32, n_layer=2, n_head=2, batch_size=4)
    whole = zerokit.train(work, "ddp", world_size=1, steps=1, optimizer="sgd", reference=False)
    one = whole.results[0].ranks[0].peak_breakdown["activations"]
    for attention in ("ring", "ulysses"):
        cut = zerokit.train(work, "ddp", world_size=2, steps=1, optimizer="sgd", parallel={"cp": 2},
                            cp_attention=attention, reference=False)
        for rank in cut.results[0].ranks:
            assert 0.5 * one <= rank.peak_breakdown["activations"] <= 0.6 * one, (attention, one, rank.peak_breakdown)
            assert rank.coords["cp"] == rank.rank
