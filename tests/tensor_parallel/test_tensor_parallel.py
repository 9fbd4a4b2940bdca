"""Tensor and sequence parallelism against a single-process reference on gloo (fp32).

Each rank builds the unsharded layers from one seed, runs them as the reference, cuts
its shards out of a copy and runs those; the ranks return their largest differences
and their communication ledgers, and the assertions run here. Bad plans are refused
without starting a process.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zerokit
from zerokit import tensor_parallel as tp
from zerokit.runtime import comm
from zerokit.workloads import CausalSelfAttention, TinyGPT

# vocab, seq_len, d_model, n_layer, n_head, batch: every size divisible by t = 2 and 4
V, S, D, L, H, B = 64, 16, 32, 2, 4, 4
BSH = B * S * D


def _tp_group(ctx, t):
    ctx.set_mesh({"dp": ctx.world_size // t, "tp": t, "pp": 1})
    return ctx.mesh.group("tp")


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max((x - y).abs().max().item() for x, y in zip(a.values(), b.values()))


def _records():
    return [dict(op=r.op, phase=r.phase, tag=r.tag, numel=r.numel, axis=r.axis, ring_cost_bytes=r.ring_cost_bytes)
            for r in comm.ledger().records]


# --- one column → row pair -----------------------------------------------------------------

def _pair(ctx, t, sp, keep):
    group = _tp_group(ctx, t)
    rank = ctx.mesh.coord("tp")
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 24), nn.GELU(), nn.Linear(24, 8))
    x = torch.randn(3, 4, 8, requires_grad=True)
    weight_out = torch.randn(3, 4, 8)
    (ref(x) * weight_out).sum().backward()

    col = tp.ColumnParallelLinear.from_linear(ref[0], group, sequence_parallel=sp, keep_input_sharded=keep)
    row = tp.RowParallelLinear.from_linear(ref[2], group, sequence_parallel=sp)
    model = nn.Sequential(col, nn.GELU(), row)
    xs = (x.detach().chunk(t, 1)[rank] if sp else x.detach()).clone().requires_grad_()
    comm.ledger().reset()
    y = model(xs)
    want_y = ref(x).detach()
    want_y, want_dx, w_out = ((v.chunk(t, 1)[rank] for v in (want_y, x.grad, weight_out)) if sp
                              else (want_y, x.grad, weight_out))
    (y * w_out).sum().backward()
    tp.allreduce_sequence_parallel_gradients(model, group)
    grads = tp.full_gradients(model, group)
    return {"output": (y - want_y).abs().max().item(), "input_grad": (xs.grad - want_dx).abs().max().item(),
            "grads": _max_diff(grads, {n: p.grad for n, p in ref.named_parameters()}),
            "ops": sorted(r["op"] for r in _records() if not r["tag"].startswith("full_"))}


@pytest.mark.parametrize("t,sp,keep", [(2, False, False), (4, False, False), (2, True, False), (4, True, True)])
def test_column_then_row_equals_the_unsharded_pair(t, sp, keep):
    for got in zerokit.launch(_pair, t, t, sp, keep):
        assert got["output"] <= 1e-6 and got["input_grad"] <= 1e-6 and got["grads"] <= 1e-6, got
        if not sp:  # f's all-reduce (backward) and g's (forward)
            assert got["ops"] == ["all_reduce", "all_reduce"]
        else:  # g and ḡ: all-gather + reduce-scatter each way (+ the regather), then the bias's gradient
            assert got["ops"] == sorted(["all_gather", "reduce_scatter"] * 2 + ["all_gather"] * keep
                                        + ["all_reduce"])


# --- vocabulary-parallel cross-entropy -----------------------------------------------------

def _cross_entropy(ctx, t):
    group = _tp_group(ctx, t)
    rank = ctx.mesh.coord("tp")
    torch.manual_seed(1)
    logits = (3 * torch.randn(B, S, V)).requires_grad_()
    targets = torch.randint(0, V, (B, S))
    targets[0, :3] = -100  # ignored, as F.cross_entropy ignores them
    want = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    want.backward()
    local = logits.detach().chunk(t, -1)[rank].clone().requires_grad_()
    comm.ledger().reset()
    with comm.phase("forward"):
        loss = tp.vocab_parallel_cross_entropy(local, targets, group)
    with comm.phase("backward"):
        loss.backward()
    return {"loss": abs(loss.item() - want.item()),
            "grad": (local.grad - logits.grad.chunk(t, -1)[rank]).abs().max().item(), "records": _records()}


@pytest.mark.parametrize("t", [2, 4])
def test_vocab_parallel_cross_entropy_equals_f_cross_entropy(t):
    for got in zerokit.launch(_cross_entropy, t, t):
        assert got["loss"] <= 1e-6 and got["grad"] <= 1e-6, got
        # max, target logit, sum of exponentials: three all-reduces of b·s elements, none backward
        assert [(r["op"], r["phase"], r["numel"], r["axis"]) for r in got["records"]] == \
            [("all_reduce", "forward", B * S, "tp")] * 3


# --- the whole tiny GPT under tiny_gpt_plan ------------------------------------------------

def _gpt(ctx, t, tie, sp, keep):
    group = _tp_group(ctx, t)
    torch.manual_seed(0)
    ref = TinyGPT(V, S, D, L, H, tie_weights=tie)
    model = copy.deepcopy(ref)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, V, (B, S + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    want = F.cross_entropy(ref(x).flatten(0, 1), y.flatten())
    want.backward()

    plan = tp.tiny_gpt_plan(sequence_parallel=sp, keep_input_sharded=keep)
    counts = tp.parameter_counts(ref, t, plan)
    tp.apply_plan(model, plan, group)
    start = tp.full_parameters(model, group)
    comm.ledger().reset()
    with comm.phase("forward"):
        loss = tp.plan_loss(plan, group)(model(x), y)
    with comm.phase("backward"):
        loss.backward()
    with comm.phase("step"):
        tp.allreduce_sequence_parallel_gradients(model, group)
    records = _records()
    grads = tp.full_gradients(model, group)
    return {"loss": abs(loss.item() - want.item()), "loss_value": loss.item(),
            "init": _max_diff(start, {n: p.detach() for n, p in ref.named_parameters()}),
            "grads": _max_diff(grads, {n: p.grad for n, p in ref.named_parameters()}),
            "tied": model.tok.weight is model.head.weight, "counts": counts,
            "counts_sharded": tp.parameter_counts(model, t),
            "local_numel": sum(p.numel() for p in model.parameters()),
            "sp_params": sorted(tp.sequence_parallel_parameters(model)), "records": records}


def _check_block_traffic(records, t, sp, keep):
    """Per layer per micro-batch: f and g each way (FACTS §4), or g and ḡ under sequence parallelism."""
    for i in range(L):
        mine = [r for r in records if r["tag"].startswith(f"blocks.{i}.")]
        assert all(r["axis"] == "tp" and r["numel"] == BSH for r in mine), mine
        fwd = sorted((r["op"], r["tag"].split(":", 1)[1]) for r in mine if r["phase"] == "forward")
        bwd = sorted((r["op"], r["tag"].split(":", 1)[1]) for r in mine if r["phase"] == "backward")
        if not sp:
            assert fwd == [("all_reduce", "g")] * 2 and bwd == [("all_reduce", "f")] * 2
        else:
            assert fwd == [("all_gather", "g")] * 2 + [("reduce_scatter", "g_bar")] * 2
            assert bwd == sorted([("all_gather", "g_bar")] * 2 + [("reduce_scatter", "g")] * 2
                                 + [("all_gather", "g:regather")] * 2 * keep)
        # the same bytes either way: 8·b·s·h·(t−1)/t elements per layer (the regather adds 2·b·s·h·(t−1)/t)
        sent = sum(r["ring_cost_bytes"] for r in mine)
        assert sent == pytest.approx((8 + 2 * keep) * BSH * (t - 1) / t * 4)


GPT_CASES = [(t, tie, sp, False) for t in (2, 4) for tie in (False, True) for sp in (False, True)] + [(4, True, True, True)]


@pytest.mark.parametrize("t,tie,sp,keep", GPT_CASES)
def test_tiny_gpt_matches_the_unsharded_model(t, tie, sp, keep):
    results = zerokit.launch(_gpt, t, t, tie, sp, keep)
    for got in results:
        assert got["init"] == 0.0  # every rank's shards are the unsharded initialisation, exactly
        assert got["loss"] <= 1e-5 and got["grads"] <= 1e-5, {k: got[k] for k in ("loss", "grads")}
        assert got["tied"] == tie
        assert got["counts"] == got["counts_sharded"] and got["local_numel"] == got["counts"]["per_rank"]
        _check_block_traffic(got["records"], t, sp, keep)
        step = [r for r in got["records"] if r["phase"] == "step"]
        if sp:
            assert got["sp_params"] == sorted(
                ["pos.weight", "ln_f.weight", "ln_f.bias"]
                + [f"blocks.{i}.{n}" for i in range(L) for n in
                   ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "attn.proj.bias", "mlp.proj.bias")])
            assert [r["op"] for r in step] == ["all_reduce"] and step[0]["numel"] == S * D + (4 * L + 2) * D + 2 * L * D
        else:
            assert got["sp_params"] == [] and step == []
    assert len({got["loss_value"] for got in results}) == 1  # every rank has the same loss


def test_plan_on_a_tp_subgroup_of_a_dp_by_tp_mesh():
    """dp=2 × tp=2 on 4 ranks: the plan runs on the tp group only; both replicas match the reference."""
    for got in zerokit.launch(_gpt, 4, 2, True, True, False):
        assert got["loss"] <= 1e-5 and got["grads"] <= 1e-5, got
        assert {r["axis"] for r in got["records"]} == {"tp"}
        _check_block_traffic(got["records"], 2, True, False)


def _accumulate_with_hooks(ctx, t):
    """Sequence-parallel gradients summed by per-parameter hooks during backward, over two micro-batches."""
    group = _tp_group(ctx, t)
    torch.manual_seed(0)
    ref = TinyGPT(V, S, D, L, H)
    model = copy.deepcopy(ref)
    plan = tp.tiny_gpt_plan(sequence_parallel=True)
    tp.apply_plan(model, plan, group)
    handles = tp.register_sequence_parallel_gradient_hooks(model, group)
    comm.ledger().reset()
    for micro in range(2):
        tokens = torch.randint(0, V, (B, S + 1), generator=torch.Generator().manual_seed(micro))
        x, y = tokens[:, :-1], tokens[:, 1:]
        F.cross_entropy(ref(x).flatten(0, 1), y.flatten()).backward()
        with comm.phase("backward"):
            tp.plan_loss(plan, group)(model(x), y).backward()
    hooked = [r for r in _records() if r["tag"].startswith("sequence_parallel_grad:")]
    for h in handles:
        h.remove()
    return {"grads": _max_diff(tp.full_gradients(model, group), {n: p.grad for n, p in ref.named_parameters()}),
            "hooked": len(hooked), "sp_params": len(tp.sequence_parallel_parameters(model))}


def test_sequence_parallel_gradient_hooks_under_accumulation():
    for got in zerokit.launch(_accumulate_with_hooks, 2, 2):
        assert got["grads"] <= 1e-5, got
        assert got["hooked"] == 2 * got["sp_params"]  # one all-reduce per parameter per micro-batch


def _train(ctx, t, tie, sp, steps):
    group = _tp_group(ctx, t)
    torch.manual_seed(0)
    ref = TinyGPT(V, S, D, L, H, tie_weights=tie)
    model = copy.deepcopy(ref)
    plan = tp.tiny_gpt_plan(sequence_parallel=sp)
    tp.apply_plan(model, plan, group)
    loss_fn = tp.plan_loss(plan, group)
    ref_opt, opt = torch.optim.SGD(ref.parameters(), lr=0.5), torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(steps):
        tokens = torch.randint(0, V, (B, S + 1), generator=torch.Generator().manual_seed(step))
        x, y = tokens[:, :-1], tokens[:, 1:]
        for m, o, loss in ((ref, ref_opt, lambda: F.cross_entropy(ref(x).flatten(0, 1), y.flatten())),
                           (model, opt, lambda: loss_fn(model(x), y))):
            o.zero_grad()
            loss().backward()
            if m is model:
                tp.allreduce_sequence_parallel_gradients(model, group)
            o.step()
    replicated = {n: p.detach().clone() for n, p in model.named_parameters() if tp.parameter_layout(model)[n] is None}
    return {"params": _max_diff(tp.full_parameters(model, group), {n: p.detach() for n, p in ref.named_parameters()}),
            "replicated": replicated}


@pytest.mark.parametrize("t,tie,sp", [(2, True, True), (4, False, False)])
def test_ten_sgd_steps_match_the_unsharded_model(t, tie, sp):
    results = zerokit.launch(_train, t, t, tie, sp, 10)
    for got in results:
        assert got["params"] <= 1e-6, got["params"]
        # replicated parameters stay identical on every tp rank, bit for bit
        assert all(torch.equal(got["replicated"][n], results[0]["replicated"][n]) for n in got["replicated"])


# --- the attention change keeps the unsharded model bit-identical --------------------------

def _attention_before_tp(self, x):
    """CausalSelfAttention.forward as it was before the tensor-parallel change."""
    b, s, d = x.shape
    q, k, v = self.qkv(x).split(d, dim=2)
    q, k, v = (t.view(b, s, self.n_head, d // self.n_head).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.proj(y.transpose(1, 2).reshape(b, s, d))


def test_attention_forward_is_bit_identical_to_before():
    torch.manual_seed(0)
    attn = CausalSelfAttention(32, 4)
    x = torch.randn(3, 8, 32, requires_grad=True)
    new = attn(x)
    new.sum().backward()
    new_grads = [x.grad.clone()] + [p.grad.clone() for p in attn.parameters()]
    x.grad = None
    attn.zero_grad()
    old = _attention_before_tp(attn, x)
    old.sum().backward()
    assert torch.equal(new, old)
    assert all(torch.equal(a, b) for a, b in zip(new_grads, [x.grad] + [p.grad for p in attn.parameters()]))


# --- bad plans, refused before any process starts ------------------------------------------

def _tiny(**kw):
    sizes = dict(vocab=V, seq_len=S, d_model=D, n_layer=1, n_head=H, tie_weights=False)
    sizes.update(kw)
    return TinyGPT(**sizes)


@pytest.mark.parametrize("model,plan,t,seq_len,match", [
    (_tiny(), tp.Plan({"blocks.*.mlp.fc": "colwise", "nothing.*": "rowwise"}), 2, None, "'nothing.*'.*matches no module"),
    (_tiny(vocab=65), tp.tiny_gpt_plan(), 2, None, "tok.*num_embeddings.*=65.*tp=2"),
    (_tiny(d_model=48, vocab=66), tp.tiny_gpt_plan(), 3, None, "blocks.0.attn.qkv.*heads=4.*tp=3"),
    (nn.Sequential(nn.Linear(8, 10), nn.Linear(10, 8)), tp.Plan({"0": "colwise", "1": "rowwise"}), 4, None,
     "0 \\(colwise\\).*out_features=10.*tp=4"),
    (_tiny(), tp.tiny_gpt_plan(sequence_parallel=True), 2, 15, "seq_len=15.*not divisible by 2"),
    (_tiny(), tp.Plan({"ln_f": "colwise"}), 2, None, "ln_f.*LayerNorm.*nn.Linear"),
    (_tiny(), tp.Plan({"head": "diagonal"}), 2, None, "style 'diagonal'.*unknown"),
    (_tiny(tie_weights=True), tp.Plan({"tok": "vocab_embedding"}), 2, None, "tok.weight and head.weight are one shared"),
    (_tiny(), tp.Plan({"tok": "vocab_embedding"}, loss="vocab_parallel"), 2, None, "needs a module with style 'vocab_head'"),
    (_tiny(), tp.tiny_gpt_plan(), 0, None, "tp=0 must be a positive integer"),
])
def test_check_plan_refuses_bad_plans(model, plan, t, seq_len, match):
    with pytest.raises(ValueError, match=match):
        tp.check_plan(model, plan, t, seq_len=seq_len)


def test_the_tiny_gpt_plan_and_its_layout():
    model = _tiny(tie_weights=True)
    assert set(tp.check_plan(model, tp.tiny_gpt_plan(True), 4, seq_len=S).values()) >= {("head", "vocab_head")}
    layout = tp.plan_layout(model, tp.tiny_gpt_plan())
    assert layout["tok.weight"] == tp.Shard(0) and "head.weight" not in layout  # tied: one parameter
    assert layout["blocks.0.attn.qkv.weight"] == tp.Shard(0, blocks=3)
    assert layout["blocks.0.mlp.proj.weight"] == tp.Shard(1) and layout["blocks.0.mlp.proj.bias"] is None
    assert layout["pos.weight"] is None and layout["ln_f.weight"] is None
    counts = tp.parameter_counts(model, 4, tp.tiny_gpt_plan())
    replicated = S * D + 2 * D + 4 * D + D + D  # pos, ln_f, ln1+ln2, attn.proj.bias, mlp.proj.bias
    assert counts["replicated"] == replicated
    assert counts["sharded"] + counts["replicated"] == sum(p.numel() for p in model.parameters())
    assert counts["per_rank"] == counts["sharded"] // 4 + replicated


def _uneven(ctx):
    with pytest.raises(ValueError, match="uneven shards are not supported"):
        tp.g_bar(torch.randn(2, 5, 4), None)
    return True


def test_uneven_sequence_is_refused():
    assert zerokit.launch(_uneven, 2) == [True, True]
