"""Hierarchical sharding in the planner: HSDP (shard in a node, replicate across) and ZeRO++'s hpZ.

- :mod:`zerokit.theory.hierarchical` against a hand count on small cases (4 ranks in 2 nodes
  of 2, one unit of 1,024 elements; padding with 1,001), and against ZeRO-3 and DDP at the
  ends of the shard-group range (s = N is ZeRO-3, s = 1 is DDP's all-reduce);
- the planner's terms and transfers are those formulas, each collective on its group's link;
- the advisor at a realistic setting (LLaMA-7B, 64 GPUs of 8 per node, a slow inter-node link)
  ranks HSDP and hpZ next to ZeRO-3 and DDP, and both cut the bytes that cross nodes;
- bad input is refused with a message that names the argument or the flag.
"""
import json

import pytest

import zerokit
from zerokit import theory
from zerokit.cli import main
from zerokit.planner.layout import from_deepspeed_config

# --- the formulas against a hand count ------------------------------------------------------------------------

PSI, N, G = 1024, 4, 2  # 4 ranks in 2 nodes of 2; one flat unit; 16-bit params and grads (b = 2), Adam (K = 12)


def test_memory_by_hand():
    # HSDP shards over the node's 2 ranks: (2 + 2 + 12)·1024/2
    hsdp = theory.hsdp_model_state_bytes(PSI, N, G)
    assert (hsdp.params, hsdp.grads, hsdp.optimizer) == (1024, 1024, 6144) and hsdp.total == 16 * 1024 // 2
    # hpZ: ZeRO-3 over all 4 (16·1024/4 = 4,096) plus the secondary 16-bit copy over 2 (2·1024/2 = 1,024)
    hpz = theory.hpz_model_state_bytes(PSI, N, G)
    assert (hpz.params, hpz.grads, hpz.optimizer) == (512 + 1024, 512, 3072) and hpz.total == 5120
    assert theory.hpz_secondary_bytes(PSI, G) == 1024
    # padding: 1,001 elements over 2 ranks is 501 each (the unit padded to 1,002)
    assert theory.hsdp_model_state_bytes(1001, N, G).params == 2 * 501
    assert theory.hpz_secondary_bytes(1001, G) == 2 * 501


def test_traffic_by_hand():
    b = 2
    # HSDP: inside the node 2 gathers + 1 reduce-scatter of (1/2)·2,048 B; across, the 512-element shard
    # all-reduced over r = 2 replicas: 2·(1/2)·1,024 B
    assert theory.hsdp_collective_bytes(PSI, N, G, b) == {"shard": {"all_gather": 2048, "reduce_scatter": 1024},
                                                          "replicate": {"all_reduce": 1024}}
    # three micro-batches: the in-group traffic ×3, the all-reduce once (or ×3, FSDP2's default)
    three = theory.hsdp_collective_bytes(PSI, N, G, b, micro_batches=3)
    assert three["shard"] == {"all_gather": 6144, "reduce_scatter": 3072} and three["replicate"]["all_reduce"] == 1024
    assert theory.hsdp_collective_bytes(PSI, N, G, b, 3, all_reduce_every_micro_batch=True)["replicate"] == \
        {"all_reduce": 3072}
    # hpZ: forward gather and reduce-scatter over all 4, (3/4)·2,048 each; backward gather over 2, (1/2)·2,048
    assert theory.hpz_collective_bytes(PSI, N, G, b) == {"global": {"all_gather": 1536, "reduce_scatter": 1536},
                                                         "secondary": {"all_gather": 1024}}


def test_bytes_per_link_and_leaving_a_node_by_hand():
    split = {s: theory.hierarchical_link_bytes(s, PSI, N, G, 2) for s in ("ddp", "zero3", "hsdp", "hpz")}
    assert split["ddp"] == {"intra_node": 0, "inter_node": 3072, "leaving_node": 3072}     # 2·(3/4)·2,048
    assert split["zero3"] == {"intra_node": 0, "inter_node": 4608, "leaving_node": 4608}   # 3·(3/4)·2,048
    # HSDP: 3,072 stay in the node; each rank's 1,024 cross, and both ranks of a node send theirs: 2,048 leave it
    assert split["hsdp"] == {"intra_node": 3072, "inter_node": 1024, "leaving_node": 2048}
    # hpZ: ZeRO-3's backward gather moved into the node: 2/3 of ZeRO-3's bytes leave it
    assert split["hpz"] == {"intra_node": 1024, "inter_node": 3072, "leaving_node": 3072}
    assert split["hpz"]["leaving_node"] * 3 == split["zero3"]["leaving_node"] * 2
    # a ring leaves a node once per ring: a flat ring of 8 over 2 nodes of 4 carries one rank's bytes out of each
    # node; 4 rings of 2 ranks one per node (stride 4) carry four ranks' bytes; a ring inside a node none
    assert theory.ring_bytes_leaving_a_node(100, 8, 1, 4) == 100
    assert theory.ring_bytes_leaving_a_node(100, 2, 4, 4) == 400
    assert theory.ring_bytes_leaving_a_node(100, 4, 1, 4) == 0


@pytest.mark.parametrize("n, s", [(8, 8), (16, 4), (64, 8), (6, 3)])
def test_the_ends_of_the_range_are_zero3_and_ddp(n, s):
    units, b = [1000, 333, 4096], 2
    zero3 = theory.comm_bytes_per_step(3, sum(units), n, b, 2, units)
    # hpZ with the secondary copy over all N ranks is ZeRO-3; HSDP with one group is ZeRO-3
    assert sum(theory.hpz_collective_bytes(0, n, n, b, 2, units)["global"].values()) + \
        sum(theory.hpz_collective_bytes(0, n, n, b, 2, units)["secondary"].values()) == zero3
    assert sum(theory.hsdp_collective_bytes(0, n, n, b, 2, units)["shard"].values()) == zero3
    assert theory.hsdp_model_state_bytes(0, n, n, units=units) == theory.model_state_bytes(3, 0, n, "bf16-mixed",
                                                                                           units=units)
    # HSDP with groups of one rank all-reduces the whole gradient across N: DDP's bytes
    assert theory.hsdp_collective_bytes(sum(units), n, 1, b)["replicate"]["all_reduce"] == \
        theory.comm_bytes_per_step(0, sum(units), n, b)
    # in between, the replicas' all-reduce is 1/s of DDP's payload over r = N/s ranks
    r = n // s
    shard = theory.shard_numel(units, s)
    assert theory.hsdp_collective_bytes(0, n, s, b, 1, units)["replicate"].get("all_reduce", 0) == \
        (2 * (r - 1) * shard * b / r if r > 1 else 0)


# --- the planner composes them ----------------------------------------------------------------------------------

def test_the_plan_is_the_formulas_on_its_links():
    hsdp = zerokit.plan(preset="llama-7b", gpus=64, strategy="hsdp")
    layout, units = hsdp.layout, hsdp.memory.units
    assert (layout.shard_group, layout.replicas) == (8, 8)  # one node's dp ranks by default
    psi = hsdp.memory.psi_rank
    steps = len(units)  # one Adam step scalar per block unit
    assert hsdp.memory.model_states == theory.hsdp_model_state_bytes(psi, 64, 8, units=units, optimizer_tensors=steps)
    by = theory.hsdp_collective_bytes(psi, 64, 8, 2, 1, units)
    links = {t.collective: (t.bytes, t.link) for t in hsdp.transfers}
    assert links == {"all_gather, shard": (by["shard"]["all_gather"], "intra-node"),
                     "reduce_scatter, shard": (by["shard"]["reduce_scatter"], "intra-node"),
                     "all_reduce, replicate": (by["replicate"]["all_reduce"], "inter-node")}
    assert hsdp.bytes_leaving_node == 8 * by["replicate"]["all_reduce"]

    hpz = zerokit.plan(preset="llama-7b", gpus=64, strategy="hpz", shard_group=4)
    assert hpz.memory.model_states == theory.hpz_model_state_bytes(psi, 64, 4, units=units, optimizer_tensors=steps)
    by = theory.hpz_collective_bytes(psi, 64, 4, 2, 1, units)
    assert hpz.comm_bytes_by_link == {"inter-node": sum(by["global"].values()),
                                      "intra-node": by["secondary"]["all_gather"]}
    assert "shard over 8 × replicate over 8" in hsdp.layout.describe()
    table = hpz.table(advice=False)
    assert "2·Ψ/N + 2·Ψ/s (secondary copy)" in table and "leave each node per step" in table


def test_micro_batches_multiply_zero3s_crossing_bytes_not_hsdps():
    """The defect lesson 11 had: at A micro-batches ZeRO-3 gathers over every node A times; HSDP's all-reduce is
    once per step, so its bytes leaving a node don't grow with A."""
    leaving = {(s, a): zerokit.plan(preset="llama-7b", gpus=64, strategy=s, micro_batches=a).bytes_leaving_node
               for s in ("zero3", "hsdp") for a in (1, 4)}
    assert leaving[("zero3", 4)] == 4 * leaving[("zero3", 1)]
    assert leaving[("hsdp", 4)] == leaving[("hsdp", 1)] < leaving[("zero3", 1)]


def test_the_advisor_ranks_hsdp_and_hpz_next_to_zero3_and_ddp_on_a_slow_inter_node_link():
    # LLaMA-7B on 64 GPUs, 8 per node, 100 Gb/s (12.5 GB/s) per GPU between nodes
    base = zerokit.plan(preset="llama-7b", gpus=64, strategy="zero3", inter_bandwidth=12.5e9)
    advice = base.advise()
    fits = {o.label: o.plan for o in advice.fits}
    ranked = [o.label for o in advice.fits]
    hsdp, hpz, zero3 = fits["HSDP (groups of 8), dp=64"], fits["ZeRO-3 + hpZ (groups of 8), dp=64"], \
        fits["ZeRO-3, dp=64"]
    assert ranked.index("HSDP (groups of 8), dp=64") < ranked.index("ZeRO-3, dp=64")
    assert ranked.index("ZeRO-3 + hpZ (groups of 8), dp=64") < ranked.index("ZeRO-3, dp=64")
    assert any(o.label.startswith("DDP") for o in advice.does_not_fit)  # DDP ranked too: 16Ψ = 108 GB does not fit
    # both cut what crosses nodes, per GPU on the inter-node link and per node
    for cut in (hsdp, hpz):
        assert cut.comm_bytes_by_link["inter-node"] < zero3.comm_bytes_by_link["inter-node"]
        assert cut.bytes_leaving_node < zero3.bytes_leaving_node
    assert hpz.bytes_leaving_node == pytest.approx(2 / 3 * zero3.bytes_leaving_node)
    # and pay for it in memory: HSDP holds 16Ψ/8, hpZ adds the 2Ψ/8 secondary copy to ZeRO-3's 16Ψ/64
    assert zero3.memory.model_states.total < hpz.memory.model_states.total < hsdp.memory.model_states.total
    reason = next(o.reason for o in advice.fits if o.label == "HSDP (groups of 8), dp=64")
    assert "leave each node" in reason and "inside groups of 8" in reason
    data = base.to_dict()
    assert {"comm_bytes_per_step_by_link", "bytes_leaving_each_node_per_step"} <= set(data["per_gpu"])
    assert any(o["label"].startswith("HSDP") for o in data["advisor"]["fits"])


def test_a_deepspeed_config_with_hpz_or_mics_plans_them():
    config = {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}
    assert from_deepspeed_config(config).items() >= {"strategy": "hpz", "shard_group": 8}.items()
    p = zerokit.plan(preset="llama-7b", gpus=64, deepspeed_config={"zero_optimization": {"stage": 3,
                                                                                         "mics_shard_size": 16}})
    assert (p.layout.strategy, p.layout.shard_group, p.layout.replicas) == ("hsdp", 16, 4)
    assert p.comm_bytes_by_link.keys() == {"inter-node"}  # groups of 16 span two nodes: all of it crosses


# --- bad input ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    (dict(strategy="hsdp", shard_group=3), "shard_group=3 must divide dp=64"),
    (dict(strategy="hpz", shard_group=128), "shard_group=128 must divide dp=64"),
    (dict(strategy="hsdp", shard_group=0), "shard_group=0 must be a positive whole number"),
    (dict(strategy="zero3", shard_group=8), "shard_group=8 applies to strategy hsdp or hpz, not zero3"),
    (dict(strategy="hsdp", offload="optimizer"), "offload: the planner models hsdp without offload"),
    (dict(strategy="hsdp2"), "strategy='hsdp2'; allowed: ddp, zero1, zero2, zero3, hsdp, hpz"),
])
def test_bad_input_is_refused_with_a_clear_message(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        zerokit.plan(preset="llama-7b", gpus=64, **options)


def test_bad_formula_input_and_bad_configs_are_refused():
    with pytest.raises(ValueError, match="shard_group=3 does not divide the 8 data-parallel ranks"):
        theory.hsdp_collective_bytes(1024, 8, 3, 2)
    with pytest.raises(ValueError, match="strategy='zero2'; allowed: ddp, zero3, hsdp, hpz"):
        theory.hierarchical_link_bytes("zero2", 1024, 8, 4, 2)
    with pytest.raises(ValueError, match="they need stage 3, not 2"):
        from_deepspeed_config({"zero_optimization": {"stage": 2, "zero_hpz_partition_size": 8}})


@pytest.mark.parametrize("argv, message", [
    (["--strategy", "hsdp", "--shard-group", "3"], "--shard-group: shard_group=3 must divide dp=64"),
    (["--strategy", "hsdp", "--shard-group", "0"], "--shard-group 0: must be a positive whole number"),
    (["--strategy", "zero2", "--shard-group", "8"], "--shard-group: shard_group=8 applies to strategy hsdp or hpz"),
])
def test_the_cli_names_the_flag(argv, message, capsys):
    assert main(["plan", "--preset", "llama-7b", "--gpus", "64", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zerokit: error: ") and message in err, err


def test_the_cli_plans_and_ranks_them(capsys):
    assert main(["plan", "--preset", "llama-7b", "--gpus", "64", "--strategy", "hpz", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["layout"]["strategy"] == "hpz" and data["layout"]["shard_group"] == 8
    assert set(data["per_gpu"]["comm_bytes_per_step_by_link"]) == {"intra-node", "inter-node"}
