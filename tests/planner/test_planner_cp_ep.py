"""Context and expert parallelism in the planner: ``zerokit plan --cp N --ep N``.

- the theory additions against a hand count: ring and Ulysses bytes from a layer's shape (and with
  grouped-query heads), activations ÷ cp, the all-to-all under uniform routing, what zerokit's MoE
  layer saves for backward (counted in this process), Mixtral 8x7B's published parameter count;
- the planner's numbers for the tiny GPT against what ``zerokit.train`` measures: cp = 2 by ring and
  by Ulysses; dp = 4 × ep = 2 with every token routed to every expert (top-k = E: routing is uniform
  by construction, so the all-to-all bytes are exact); dp = 2 × ep = 2 with a real top-2 router (the
  uniform estimate is an assumption: the measured bytes lie near it); ZeRO-1–3 over dp × cp and over dp
  and edp. Bytes per axis and model states
  to the byte; activations from below within 5 %, test_planner.py's bound for a small hidden size
  (what the plan leaves out — LayerNorm's mean and rstd, token ids, targets, positions — weighs
  more at h = 32);
- the advisor ranks layouts with ep; bad input is refused with a message naming the argument or flag.
"""
import json

import pytest
import torch

import zerokit
from zerokit import theory
from zerokit.cli import main
from zerokit.planner import plan, preset, tiny_gpt_spec
from zerokit.theory import context as cp_theory
from zerokit.theory import experts as ep_theory

TINY = dict(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2)
BATCH = 8


# --- the formulas against a hand count ------------------------------------------------------------------------

def test_cp_bytes_from_the_shape_by_hand():
    # the tiny GPT's layer: 8 sequences of 16 tokens over cp = 2, h = 32, fp32: |K| = 8·8·32·4 = 8,192 B
    ring = cp_theory.cp_attention_bytes("ring", 2, 16, 8, 32, 32, 4)
    assert ring == {"forward": 2 * 8192, "backward": 4 * 8192 + 2 * 8192} == theory.ring_attention_bytes(2, 8192)
    # Ulysses: four all-to-alls each way, each (cp − 1)/cp of a 8,192-byte tensor
    ulysses = cp_theory.cp_attention_bytes("ulysses", 2, 16, 8, 32, 32, 4)
    assert ulysses == {"forward": 16384, "backward": 16384} == theory.ulysses_bytes(2, 8192)
    # grouped-query heads (q 64 wide, K and V 16), cp = 4, one sequence of 16 tokens, 2-byte elements:
    # the ring moves K and V blocks, 4·16·2 = 128 B each; Ulysses moves Q, K, V and the output
    assert cp_theory.cp_attention_bytes("ring", 4, 16, 1, 64, 16, 2) == {"forward": 2 * 3 * 128,
                                                                         "backward": 4 * 3 * 128 + 2 * 128}
    assert cp_theory.cp_attention_bytes("ulysses", 4, 16, 1, 64, 16, 2) == {"forward": 3 * 4 * 160 * 2 // 4,
                                                                            "backward": 960}
    assert cp_theory.cp_attention_calls("ring", 4) == {"forward": 3, "backward": 7}
    assert cp_theory.cp_attention_calls("ulysses", 4) == {"forward": 4, "backward": 4}


def test_activations_divide_by_cp():
    s, b, h, a = 4096, 1, 1024, 16
    kw = dict(element_bytes=2, dropout=False)
    for fused in (True, False):
        whole = theory.transformer_layer_activation_bytes(s, b, h, a, fused_attention=fused, **kw)
        for cp in (2, 4, 8):
            # every term is per token, the scores' rows span every key: Ulysses holds exactly 1/cp
            assert cp_theory.cp_layer_activation_bytes(s, b, h, a, cp, "ulysses", fused_attention=fused,
                                                       **kw) == pytest.approx(whole / cp)
            # the ring also keeps its fp32 output accumulator: 4·h per token
            assert cp_theory.cp_layer_activation_bytes(s, b, h, a, cp, "ring", fused_attention=fused, **kw) == \
                pytest.approx(whole / cp + 4 * h * s // cp)


def test_alltoall_bytes_under_uniform_routing_by_hand():
    # T = 32 tokens, top-2, d = 32, fp32, ep = 2: S = 32·2·1/2 = 32 rows leave; forward 8 + 65·4·32, backward
    # 64·4·32 — together moe_alltoall_bytes on a split of 32 rows each way
    two = ep_theory.moe_alltoall_bytes_uniform(32, 2, 32, 4, 2)
    assert two == {"forward": 8 + 65 * 4 * 32, "backward": 64 * 4 * 32}
    assert sum(two.values()) == theory.moe_alltoall_bytes(32, 32, 32, 4, 2) == 16520
    # ep = 4: 3/4 of the 64 routed rows leave (48); the counts go to 3 peers
    assert ep_theory.moe_alltoall_bytes_uniform(32, 2, 32, 4, 4) == {"forward": 24 + 65 * 4 * 48,
                                                                     "backward": 64 * 4 * 48}
    assert ep_theory.moe_alltoall_bytes_uniform(32, 2, 32, 4, 1) == {"forward": 0, "backward": 0}


def test_what_zerokits_moe_layer_saves_is_the_formula():
    """zerokit's MoE MLP (no ep), T = 32 tokens, top-2 of 4, fp32: the storages saved for backward, counted with
    autograd's hooks, are the dense MLP's (e·h + 2e·ffn per token) plus moe_extra_activation_bytes — and the
    per-sequence fractions f (b·E·4 B) and the aux loss (4 B). Dropless: the sizes do not depend on the routing."""
    from zerokit.expert_parallel.moe import MoEMLP

    torch.manual_seed(0)
    layer = MoEMLP(32, 4, 2).train()
    x = torch.randn(2, 16, 32, requires_grad=True)
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    measured = sum(n for ptr, n in saved.items() if ptr not in params)
    dense = 32 * (4 * 32 + 2 * 4 * 128)
    extra = ep_theory.moe_extra_activation_bytes(16, 2, 32, 128, 4, 2, element_bytes=4)
    assert extra == 32 * (4 * 2 * 4 * 32 + 1 * 2 * 4 * 128 + 4 * 4 + 28 * 2)  # 2,120 B per token
    assert measured == dense + extra + 2 * 4 * 4 + 4


def test_mixtral_8x7b_has_its_published_parameter_count():
    mixtral = preset("mixtral-8x7b")
    assert mixtral.param_count == 46_702_792_704  # Mistral's 46.7 B
    experts = mixtral.expert_param_count
    assert experts == 32 * 8 * 3 * 4096 * 14336
    active = mixtral.param_count - experts + experts * 2 // 8
    assert active == pytest.approx(12.9e9, rel=0.005)  # 12.9 B active per token (top-2)
    # the tiny GPT's MoE: the same tensors, names and sizes as zerokit.tiny_gpt(..., n_experts=4, top_k=2) builds
    spec = tiny_gpt_spec(**TINY, n_experts=4, top_k=2)
    model = zerokit.tiny_gpt(**TINY, batch_size=BATCH, n_experts=4, top_k=2).build_model()
    assert [(p.name, p.numel) for p in spec.tensors] == [(n, p.numel()) for n, p in model.named_parameters()]


# --- the planner against zerokit's ledgers ----------------------------------------------------------------------

def _axes(rank) -> dict:
    return {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items() if row["ring_cost_bytes"]}


@pytest.mark.parametrize("attention", ["ring", "ulysses"])
def test_planned_cp_equals_what_train_measures(attention):
    """cp = 2 on the tiny GPT: the cp bytes and the dp × cp gradient all-reduce to the byte, model states to the
    byte, activations from below within 5 %. zerokit's Ulysses computes its heads' attention unfused (the
    softmax saved), so it is planned with fused_attention=False; the ring keeps only its log-sum-exp."""
    work = zerokit.tiny_gpt(**TINY, batch_size=BATCH)
    rank = zerokit.train(work, "ddp", world_size=2, steps=1, parallel={"cp": 2}, cp_attention=attention,
                         reference=False).result.ranks[0]
    p = plan(tiny_gpt_spec(**TINY), gpus=2, parallel={"cp": 2}, cp_attention=attention, precision="fp32",
             micro_batch_size=BATCH, fused_attention=attention == "ring")
    assert p.comm_bytes_per_step == _axes(rank) == rank.theory_comm_bytes_by_axis  # {"cp": …, "dp_cp": …}
    assert set(p.comm_bytes_per_step) == {"cp", "dp_cp"}
    assert p.per_gpu()["model_state_bytes"] == {**rank.model_state_bytes, "total": sum(rank.model_state_bytes.values())}
    measured = rank.peak_by_category["activations"]
    assert p.memory.activations <= measured <= 1.05 * p.memory.activations
    # ÷ cp: the plan at cp = 2 holds half of the plan at cp = 1 but for the ring's accumulator and the output terms
    one = plan(tiny_gpt_spec(**TINY), gpus=1, precision="fp32", micro_batch_size=BATCH,
               fused_attention=attention == "ring")
    assert p.memory.activations < 0.55 * one.memory.activations


def test_planned_ep_with_uniform_routing_equals_what_train_measures():
    """dp = 4 × ep = 2, 4 experts and top-4: every token reaches every expert, so each rank sends exactly the
    uniform share. Dense gradients over dp, the experts' over edp, the all-to-alls on ep: to the byte."""
    work = zerokit.tiny_gpt(**TINY, batch_size=BATCH, n_experts=4, top_k=4)
    ranks = zerokit.train(work, "ddp", world_size=4, steps=1, parallel={"dp": 4, "ep": 2},
                          reference=False).result.ranks
    p = plan(tiny_gpt_spec(**TINY, n_experts=4, top_k=4), gpus=4, parallel={"dp": 4, "ep": 2}, precision="fp32",
             micro_batch_size=BATCH // 4)
    for rank in ranks:
        assert p.comm_bytes_per_step == _axes(rank) == rank.theory_comm_bytes_by_axis  # dp, edp, ep
        assert p.per_gpu()["model_state_bytes"]["total"] == sum(rank.model_state_bytes.values())
        measured = rank.peak_by_category["activations"]
        assert p.memory.activations <= measured <= 1.05 * p.memory.activations
    # expert states ÷ ep: the dense part whole, the experts halved
    spec = p.model
    assert p.memory.psi_rank == spec.param_count - spec.expert_param_count + spec.expert_param_count // 2
    whole = plan(spec, gpus=4, precision="fp32", micro_batch_size=BATCH // 4)
    assert whole.memory.psi_rank == spec.param_count


def test_planned_ep_with_a_real_router_is_near_what_train_measures():
    """dp = 2 × ep = 2, top-2: the router decides where rows go, so the ep bytes are the uniform estimate only on
    average (here within 10 %); the dense all-reduce and the model states are exact."""
    work = zerokit.tiny_gpt(**TINY, batch_size=BATCH, n_experts=4, top_k=2)
    ranks = zerokit.train(work, "ddp", world_size=2, steps=1, parallel={"dp": 2, "ep": 2},
                          reference=False).result.ranks
    p = plan(tiny_gpt_spec(**TINY, n_experts=4, top_k=2), gpus=2, parallel={"dp": 2, "ep": 2}, precision="fp32",
             micro_batch_size=BATCH // 2)
    planned = p.comm_bytes_per_step
    assert set(planned) == {"dp", "ep"}  # edp = dp/ep = 1: no gradient traffic for the experts
    mean_ep = sum(_axes(r)["ep"] for r in ranks) / len(ranks)
    for rank in ranks:
        assert _axes(rank)["dp"] == planned["dp"] == rank.theory_comm_bytes_by_axis["dp"]
        assert p.per_gpu()["model_state_bytes"]["total"] == sum(rank.model_state_bytes.values())
    assert mean_ep == pytest.approx(planned["ep"], rel=0.10)
    assert any("uniform routing" in note for note in p.notes)


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_planned_zero_over_dp_cp_and_over_dp_edp_equals_what_train_measures(strategy):
    """ZeRO composes with both: with cp the states are sharded over the dp × cp ranks that reduce the gradients;
    with ep the dense part over dp and the experts over edp, each unit padded to its own group. Model states and
    bytes per axis to the byte (dp = 2 × cp = 2 by ring; dp = 4 × ep = 2, top-4 so that routing is uniform)."""
    rank = zerokit.train(zerokit.tiny_gpt(**TINY, batch_size=BATCH), strategy, world_size=4,
                         parallel={"dp": 2, "cp": 2}, steps=1, reference=False).result.ranks[0]
    p = plan(tiny_gpt_spec(**TINY), gpus=4, parallel={"dp": 2, "cp": 2}, strategy=strategy, precision="fp32",
             micro_batch_size=BATCH // 2)
    assert p.comm_bytes_per_step == _axes(rank)
    assert p.per_gpu()["model_state_bytes"] == {**rank.model_state_bytes, "total": sum(rank.model_state_bytes.values())}
    assert p.memory.activations <= rank.peak_by_category["activations"] <= 1.05 * p.memory.activations

    rank = zerokit.train(zerokit.tiny_gpt(**TINY, batch_size=BATCH, n_experts=4, top_k=4), strategy, world_size=4,
                         parallel={"dp": 4, "ep": 2}, steps=1, reference=False).result.ranks[0]
    p = plan(tiny_gpt_spec(**TINY, n_experts=4, top_k=4), gpus=4, parallel={"dp": 4, "ep": 2}, strategy=strategy,
             precision="fp32", micro_batch_size=BATCH // 4)
    assert p.comm_bytes_per_step == _axes(rank)
    assert p.per_gpu()["model_state_bytes"] == {**rank.model_state_bytes, "total": sum(rank.model_state_bytes.values())}


@pytest.mark.parametrize("parallel,experts", [({"cp": 2, "tp": 2}, {}), ({"tp": 2}, dict(n_experts=4, top_k=2)),
                                              ({"dp": 2, "ep": 2, "tp": 2}, dict(n_experts=4, top_k=4)),
                                              ({"cp": 2}, dict(n_experts=4, top_k=2))])
def test_planned_grids_equal_what_train_measures(parallel, experts):
    """cp × tp, experts split by tp (alone and with ep; top-4 of 4 where ep is on, so routing is uniform), and a
    MoE model under cp: bytes on every axis and model states to the byte — the tp bytes with the MoE layers' gates
    and, without sequence parallelism, the experts' output biases; the cp bytes with the load-balancing loss's
    statistics. Activations within 5 % either way: under two splits at once the plan's
    per-layer terms (a Megatron layer's) and zerokit's saved tensors part by a few per cent (cp × tp: the plan above)."""
    world = parallel.get("dp", 1) * parallel.get("cp", 1) * parallel.get("tp", 1)
    work = zerokit.tiny_gpt(**TINY, batch_size=BATCH, **experts)
    rank = zerokit.train(work, "ddp", world_size=world, steps=1, parallel=parallel, reference=False).result.ranks[0]
    p = plan(tiny_gpt_spec(**TINY, **experts), gpus=world, parallel=parallel, precision="fp32",
             micro_batch_size=BATCH // parallel.get("dp", 1), sequence_parallel=False)
    theory_bytes = {axis: v for axis, v in rank.theory_comm_bytes_by_axis.items() if v}  # tp alone: dp has 0
    assert p.comm_bytes_per_step == _axes(rank) == pytest.approx(theory_bytes, abs=0.5)
    assert p.per_gpu()["model_state_bytes"]["total"] == sum(rank.model_state_bytes.values())
    assert rank.peak_by_category["activations"] == pytest.approx(p.memory.activations, rel=0.05)


# --- the advisor, the CLI, bad input ----------------------------------------------------------------------------

def test_the_advisor_ranks_expert_parallel_layouts():
    """Mixtral 8x7B on 64 GPUs: only the layouts that spread the experts fit ZeRO-1/2; the advisor ranks
    them, with their all-to-all, next to ep = 1."""
    base = plan(preset="mixtral-8x7b", gpus=64, strategy="zero3", fused_attention=True, checkpointing="full")
    advice = base.advise()
    labels = [o.label for o in advice.fits]
    assert any("ep=8" in label for label in labels) and "ZeRO-3, dp=64, checkpointing full" in labels
    best = advice.fits[0]
    assert best.layout.ep > 1 and "all-to-all" in best.reason
    assert best.plan.comm_seconds <= min(o.plan.comm_seconds for o in advice.fits)
    by_ep = {o.layout.ep: o.plan for o in advice.fits if o.layout.strategy == "zero3"}
    # more experts per rank, fewer bytes of expert gradients; more ranks to send tokens to, more all-to-all
    assert by_ep[8].memory.psi_rank < by_ep[2].memory.psi_rank < by_ep[1].memory.psi_rank
    assert by_ep[2].comm_bytes_per_step["ep"] < by_ep[8].comm_bytes_per_step["ep"]
    assert "edp" in by_ep[8].comm_bytes_per_step and "edp" not in by_ep[1].comm_bytes_per_step


def test_the_advisor_ranks_context_parallel_layouts_at_long_context():
    """A 7B LLaMA-like shape at 128k tokens on 8 GPUs: activations outweigh the model states, so the advisor
    ranks cutting the sequence (cp) next to offload; at cp = 2 the activations halve, and the cp traffic is the
    ring's per layer and micro-batch."""
    base = plan(layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000, seq_len=131072, gpus=8,
                strategy="zero3", checkpointing="full", fused_attention=True)
    assert not base.fits and base.memory.activations > base.memory.model_states.total
    advice = base.advise()
    with_cp = [o for o in advice.fits if o.layout.cp > 1]
    assert with_cp and all("CP (ring)" in o.reason for o in with_cp)
    zero3 = next(o.plan for o in with_cp if o.layout.strategy == "zero3" and o.layout.cp == 2 and
                 o.layout.offload == "none")
    assert zero3.layout.dp == 4 and zero3.layout.micro_batches == 2  # the 8 sequences per step kept
    assert zero3.memory.activations < 0.6 * base.memory.activations
    layer = cp_theory.cp_attention_bytes("ring", 2, 131072, 1, 4096, 4096, 2)
    assert zero3.comm_bytes_per_step["cp"] == 32 * 2 * (2 * layer["forward"] + layer["backward"])  # recomputed


def test_the_cli_plans_cp_and_ep(capsys):
    assert main(["plan", "--preset", "llama-7b", "--gpus", "8", "--seq-len", "32768", "--cp", "4",
                 "--cp-attention", "ulysses", "--no-advice"]) == 2  # a preset and a shape are not mixed
    capsys.readouterr()
    assert main(["plan", "--layers", "2", "--hidden", "32", "--heads", "2", "--vocab", "64", "--seq-len", "16",
                 "--gpus", "4", "--ep", "2", "--experts", "4", "--top-k", "2", "--json",
                 "--no-advice"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["per_gpu"]["comm_bytes_per_step"]) == {"dp", "edp", "ep"}
    assert out["layout"]["ep"] == 2 and out["model"]["experts"] == 4
    assert main(["plan", "--preset", "mixtral-8x7b", "--gpus", "16", "--cp", "2", "--strategy", "zero3",
                 "--no-advice"]) == 0
    text = capsys.readouterr().out
    assert "cp=2 (ring)" in text and "send/recv (ring attention)" in text and "dp_cp" in text


@pytest.mark.parametrize("kwargs, message", [
    (dict(model=tiny_gpt_spec(**TINY, n_experts=6, top_k=2), gpus=4, parallel={"dp": 4, "ep": 3}),
     "ep=3 must divide dp=4"),
    (dict(model=tiny_gpt_spec(**TINY, n_experts=4, top_k=2), gpus=6, ep=3), "ep=3 must divide the 4 experts"),
    (dict(model=tiny_gpt_spec(**TINY), gpus=2, ep=2), "no experts to spread"),
    (dict(model=tiny_gpt_spec(**TINY), gpus=4, cp=4, cp_attention="ulysses"), "splits the heads over cp = 4"),
    (dict(model=tiny_gpt_spec(**TINY), gpus=3, cp=3), "multiple of 2·cp = 6"),
    (dict(model=tiny_gpt_spec(**TINY), gpus=2, cp=2, cp_attention="flash"), "cp_attention='flash'"),
    (dict(params=7e9, gpus=2, cp=2), "no sequence to cut"),
    (dict(model=tiny_gpt_spec(**TINY), gpus=2, experts=4, top_k=5), "top_k=5 must be between 1 and experts=4"),
    (dict(model=tiny_gpt_spec(**TINY, n_experts=4, top_k=2), gpus=4, cp=2, ep=2), "without context parallelism"),
    (dict(model=tiny_gpt_spec(**TINY, n_experts=4, top_k=2), gpus=2, ep=2, strategy="hsdp"),
     "ddp and zero1-3"),
    (dict(model=tiny_gpt_spec(**TINY), gpus=2, cp=2, parallel={"cp": 1}), "contradicts parallel"),
])
def test_bad_input_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        plan(**kwargs)


def test_bad_flags_are_named(capsys):
    assert main(["plan", "--preset", "llama-7b", "--gpus", "6", "--cp", "3"]) == 2
    assert "--cp: cp=3: seq_len=2048 must be a multiple of 2·cp = 6" in capsys.readouterr().err
    assert main(["plan", "--preset", "llama-7b", "--gpus", "8", "--cp", "3"]) == 2
    assert "--cp/--ep: parallel: cp × tp × pp = 3 does not divide the world size 8" in capsys.readouterr().err
    assert main(["plan", "--preset", "llama-7b", "--gpus", "8", "--ep", "2"]) == 2
    assert "--ep: ep=2: the model has no experts" in capsys.readouterr().err
    assert main(["plan", "--preset", "llama-7b", "--gpus", "8", "--ep", "0"]) == 2
    assert "--ep 0: must be a positive whole number" in capsys.readouterr().err
    assert main(["plan", "--preset", "llama-7b", "--parallel", "cp=2"]) == 2
    assert "context and expert parallelism: --cp N, --ep N" in capsys.readouterr().err
