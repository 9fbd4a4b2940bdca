"""The planner held against the ZeRO paper, DeepSpeed's own estimators and zerokit's measured ledgers.

- the paper's Table 1 (Ψ = 7.5 B, N = 64): 120 / 31.4 / 16.6 / 1.88 GB;
- DeepSpeed's ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``
  called as they are installed, in DeepSpeed's convention, for several models and GPU counts;
- what ``zerokit.train`` measures for the tiny GPT, with ddp, zero1-3 and dp × tp: model states
  and traffic exactly, activations within the bound the missing terms allow (pipeline
  parallelism is not in ``zerokit.train`` yet: its plan is checked against the formulas only);
- the seed's claims (FACTS §8), the theory additions, the CLI, the panel and bad input.
"""
import json
import math

import pytest

import zerokit
from zerokit import theory
from zerokit.cli import main
from zerokit.planner import PRESETS, plan, tiny_gpt_spec
from zerokit.planner.models import preset

STAGES = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}


# --- theory: the two functions the tensor-parallel work uses -------------------------------------------

def test_tp_model_state_bytes_splits_the_sharded_elements_and_keeps_the_rest_whole():
    for precision in theory.PRECISIONS:
        whole = theory.model_state_bytes(0, 1000 + 24, 1, precision)
        assert theory.tp_model_state_bytes(1000, 24, 1, precision) == whole
        split = theory.tp_model_state_bytes(1001, 24, 4, precision)  # ⌈1001/4⌉ = 251 elements of the split part
        assert split == theory.model_state_bytes(0, 251 + 24, 1, precision)
    # the tiny GPT's own split: every weight matrix and column-parallel bias over t, norms and row biases whole
    spec = tiny_gpt_spec()
    sharded = sum(p.numel for p in spec.tensors if p.tp_sharded)
    replicated = sum(p.numel for p in spec.tensors if not p.tp_sharded)
    states = theory.tp_model_state_bytes(sharded, replicated, 2, "bf16-mixed")
    assert states.params == 2 * (sharded // 2 + replicated) and states.optimizer == 12 * (sharded // 2 + replicated)
    with pytest.raises(ValueError, match="t=0"):
        theory.tp_model_state_bytes(10, 0, 0)


def test_sequence_parallel_activations_divide_korthikantis_replicated_ten_by_t():
    s, b, h, a = 2048, 1, 4096, 32
    assert theory.activation_bytes_per_layer_sequence_parallel(s, b, h, a, 1) == theory.activation_bytes_per_layer(
        s, b, h, a, 1)
    for t in (2, 4, 8):
        sp = theory.activation_bytes_per_layer_sequence_parallel(s, b, h, a, t)
        assert sp == pytest.approx(s * b * h * (34 / t + 5 * a * s / (h * t)))
        assert theory.activation_bytes_per_layer(s, b, h, a, t) - sp == pytest.approx(10 * s * b * h * (1 - 1 / t))
        # the term-by-term function gives both of Korthikanti's formulas under his assumptions
        assert theory.transformer_layer_activation_bytes(s, b, h, a, t) == pytest.approx(
            theory.activation_bytes_per_layer(s, b, h, a, t))
        assert theory.transformer_layer_activation_bytes(s, b, h, a, t, sequence_parallel=True) == pytest.approx(sp)
        # QKV and the MLP saving their gathered inputs, not their shards: 2·2·s·b·h·(1 − 1/t) more
        saved = theory.transformer_layer_activation_bytes(s, b, h, a, t, sequence_parallel=True, regather=False)
        assert saved - sp == pytest.approx(4 * s * b * h * (1 - 1 / t))


def test_checkpointing_policies_store_less_and_recompute_one_segment():
    n, layer, x = 16, 100.0, 5.0
    assert theory.checkpointed_activation_bytes(n, layer, x, "none") == 1600
    assert theory.checkpointed_activation_bytes(n, layer, x, "full") == 16 * 5 + 100
    assert theory.checkpointed_activation_bytes(n, layer, x, "every-k", 4) == 4 * 5 + 4 * 100
    assert theory.checkpointed_activation_bytes(n, layer, x, "sqrt") == 4 * 5 + 4 * 100  # k = √16
    assert theory.checkpointed_activation_bytes(n, layer, x, "full", in_flight=3) == 3 * 80 + 100
    with pytest.raises(ValueError, match="allowed: none, full, every-k, sqrt"):
        theory.checkpointed_activation_bytes(n, layer, x, "half")


def test_collectives_by_kind_sum_to_the_step_traffic():
    for stage in range(4):
        for n in (2, 3, 8, 64):
            for a in (1, 4):
                kinds = theory.zero_collective_bytes(stage, 10_000_001, n, 2, a)
                assert sum(kinds.values()) == pytest.approx(theory.comm_bytes_per_step(stage, 10_000_001, n, 2, a))


# --- models ------------------------------------------------------------------------------------------

PUBLISHED = {"gpt2-1.5b": 1_557_611_200, "t5-3b": 2_851_598_336, "llama-7b": 6_738_415_616,
             "llama-13b": 13_015_864_320, "llama-65b": 65_285_660_672, "llama3-8b": 8_030_261_248,
             "llama3-70b": 70_553_706_496, "llama3-405b": 405_853_388_800}


def test_presets_have_their_published_parameter_counts():
    for name, count in PUBLISHED.items():
        assert preset(name).param_count == count, name
    assert preset("gpt3-175b").param_count == pytest.approx(175e9, rel=0.005)
    assert set(PRESETS) == set(PUBLISHED) | {"gpt3-175b"}


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_gpt_spec_is_the_tiny_gpt(tied):
    shape = dict(vocab=96, seq_len=16, d_model=32, n_layer=3, n_head=4, tie_weights=tied)
    model = zerokit.tiny_gpt(**shape).build_model()
    spec = tiny_gpt_spec(**shape)
    params = dict(model.named_parameters())
    assert [p.name for p in spec.tensors] == list(params)
    assert [p.numel for p in spec.tensors] == [p.numel() for p in params.values()]


# --- the ZeRO paper's Table 1 -------------------------------------------------------------------------

def test_paper_table_one_at_7_5b_on_64_gpus():
    expected = {"ddp": "120 GB", "zero1": "31.4 GB", "zero2": "16.6 GB", "zero3": "1.88 GB"}
    for strategy, text in expected.items():
        p = plan(params=7.5e9, gpus=64, strategy=strategy)
        total = p.per_gpu()["model_state_bytes"]["total"]
        assert p.convention.text(total) == text
        assert total == theory.paper_model_state_bytes(STAGES[strategy], 7.5e9, 64)


# --- DeepSpeed's estimators, as installed ------------------------------------------------------------

@pytest.fixture(scope="module")
def deepspeed_estimators():
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed: its estimators can't be compared")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs, model_to_params
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    return estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs, model_to_params


CLUSTERS = [(1, 1), (4, 4), (8, 8), (16, 8), (64, 8), (256, 8)]  # (GPUs, GPUs per node)


@pytest.mark.parametrize("name", ["gpt2-1.5b", "t5-3b", "llama-7b", "llama3-70b", "gpt3-175b"])
def test_deepspeed_convention_equals_deepspeeds_estimators(deepspeed_estimators, name):
    zero2, zero3, _ = deepspeed_estimators
    spec = preset(name)
    psi, largest = spec.param_count, spec.largest_module()
    for gpus, per_node in CLUSTERS:
        nodes = gpus // per_node
        for offload in ("none", "optimizer", "params"):
            for strategy in ("zero2", "zero3"):
                if offload == "params" and strategy == "zero2":
                    continue
                p = plan(name, gpus=gpus, gpus_per_node=per_node, strategy=strategy, offload=offload,
                         convention="deepspeed")
                if strategy == "zero2":
                    cpu, gpu = zero2(psi, per_node, nodes, cpu_offload=offload != "none")
                else:
                    cpu, gpu, _ = zero3(psi, largest, per_node, nodes, cpu_offload=offload != "none",
                                        cpu_offload_params=offload == "params")
                where = f"{name} {strategy} offload={offload} on {gpus} GPUs"
                assert p.per_gpu()["model_state_bytes"]["total"] == gpu, where
                assert p.host_bytes_per_node == cpu, where


def test_deepspeeds_largest_layer_is_the_planners(deepspeed_estimators):
    *_, model_to_params = deepspeed_estimators
    for tied in (False, True):
        shape = dict(vocab=96, seq_len=16, d_model=32, n_layer=3, n_head=4, tie_weights=tied)
        total, largest = model_to_params(zerokit.tiny_gpt(**shape).build_model())
        spec = tiny_gpt_spec(**shape)
        assert (total, largest) == (spec.param_count, spec.largest_module())


def test_the_conventions_differ_as_the_output_says():
    paper = plan("llama-7b", gpus=8, strategy="zero2")
    ds = plan("llama-7b", gpus=8, strategy="zero2", convention="deepspeed")
    psi = paper.model.param_count
    assert ds.per_gpu()["model_state_bytes"]["total"] == 2 * psi + int(18 * psi / 8)
    assert paper.per_gpu()["model_state_bytes"]["total"] == pytest.approx(2 * psi + 14 * psi / 8, rel=1e-6)
    assert ds.convention.unit_name == "GiB" and paper.convention.unit_name == "GB"
    text = paper.table(advice=False)
    assert "18" in text and "1.5 buffer factor" in text and "GiB" in text and "no ZeRO-1" in text
    with pytest.raises(ValueError, match="16-bit training with Adam"):
        plan("llama-7b", gpus=8, strategy="zero2", convention="deepspeed", precision="fp32")


# --- zerokit's own ledgers: the tiny GPT, planned and measured ----------------------------------------

TINY = dict(vocab=512, seq_len=64, d_model=128, n_layer=4, n_head=4)


@pytest.mark.parametrize("precision", theory.PRECISIONS)
@pytest.mark.parametrize("strategy", list(STAGES))
def test_planned_tiny_gpt_equals_what_train_measures(strategy, precision):
    """Model states and data-parallel traffic exactly; activations from below, within 1 %.

    The measured activation peak is ``peak_by_category["activations"]``, the category's own
    maximum (end of forward); ``peak_breakdown`` is the split at the *total's* peak, which for
    bf16 DDP falls after the step, when no activation is alive. The tiny GPT has no dropout
    and calls scaled_dot_product_attention, so the plan counts no masks and no s×s scores but
    the fp32 log-sum-exp. What it leaves out — LayerNorm's saved mean and rstd (8 B per token
    per norm), the int64 token ids, positions and targets — is 0.3-0.4 % here.
    """
    work = zerokit.tiny_gpt(**TINY, batch_size=8)
    rank = zerokit.train(work, strategy, world_size=2, steps=1, precision=precision, reference=False).result.ranks[0]
    p = plan(tiny_gpt_spec(**TINY), gpus=2, strategy=strategy, precision=precision, micro_batch_size=4)
    planned = p.per_gpu()
    assert planned["model_state_bytes"] == {**rank.model_state_bytes, "total": sum(rank.model_state_bytes.values())}
    assert planned["model_state_bytes"]["total"] == rank.theory_model_states["total"]
    measured = rank.peak_by_category["activations"]
    assert planned["activation_bytes"] <= measured <= 1.01 * planned["activation_bytes"]
    assert planned["comm_bytes_per_step"]["dp"] == rank.comm_ring_cost_bytes_per_step == \
        rank.theory_comm_bytes_per_step


def test_planned_tiny_gpt_with_tied_weights_and_accumulation_at_four_ranks():
    """A smaller tied GPT, 2 micro-batches on 4 ranks: the missing per-token terms weigh more (h = 64): < 5 %."""
    shape = dict(vocab=256, seq_len=32, d_model=64, n_layer=2, n_head=4, tie_weights=True)
    work = zerokit.tiny_gpt(**shape, batch_size=16)
    for strategy, precision in (("zero2", "bf16-mixed"), ("zero3", "fp32")):
        rank = zerokit.train(work, strategy, world_size=4, steps=1, precision=precision, micro_batches=2,
                             reference=False).result.ranks[0]
        planned = plan(tiny_gpt_spec(**shape), gpus=4, strategy=strategy, precision=precision, micro_batch_size=2,
                       micro_batches=2).per_gpu()
        assert planned["model_state_bytes"]["total"] == sum(rank.model_state_bytes.values())
        assert planned["activation_bytes"] <= rank.peak_by_category["activations"] <= 1.05 * \
            planned["activation_bytes"]
        assert planned["comm_bytes_per_step"]["dp"] == rank.comm_ring_cost_bytes_per_step


TP_CASES = [("ddp", {"dp": 1, "tp": 2}, True, "fp32", 1), ("zero3", {"dp": 2, "tp": 2}, False, "bf16-mixed", 1),
            ("zero2", {"dp": 2, "tp": 2}, True, "fp32", 2)]


@pytest.mark.parametrize("strategy, parallel, sequence_parallel, precision, micro_batches", TP_CASES)
def test_planned_tiny_gpt_with_tensor_parallelism_equals_what_train_measures(strategy, parallel, sequence_parallel,
                                                                             precision, micro_batches):
    """dp × tp on the tiny GPT's Megatron plan: model states and the traffic on both axes exactly.

    tp traffic: the layers' four all-reduces, the vocabulary-parallel embedding's and the head's,
    the cross-entropy's three per token, and with sequence parallelism the gradient sums of the
    parameters kept whole. Activations: with sequence parallelism zerokit's tiny GPT plan saves
    each column-parallel layer's gathered input (Megatron keeps the shard and re-gathers), so
    the measurement lies between the plan with and without re-gathering, within 1 % of the latter.
    """
    n = parallel["dp"] * parallel["tp"]
    work = zerokit.tiny_gpt(**TINY, batch_size=8)
    rank = zerokit.train(work, strategy, world_size=n, steps=1, precision=precision, parallel=parallel,
                         sequence_parallel=sequence_parallel, micro_batches=micro_batches,
                         reference=False).result.ranks[0]
    kwargs = dict(gpus=n, parallel=parallel, strategy=strategy, precision=precision,
                  micro_batch_size=8 // parallel["dp"] // micro_batches, micro_batches=micro_batches,
                  sequence_parallel=sequence_parallel)
    saved = plan(tiny_gpt_spec(**TINY), sequence_parallel_regather=False, **kwargs)
    regathered = plan(tiny_gpt_spec(**TINY), **kwargs)
    assert saved.per_gpu()["model_state_bytes"]["total"] == sum(rank.model_state_bytes.values())
    measured = rank.peak_by_category["activations"]
    assert regathered.memory.activations <= measured <= 1.01 * saved.memory.activations
    by_axis = {axis: row["ring_cost_bytes"] for axis, row in rank.comm_bytes_by_axis.items() if row["ring_cost_bytes"]}
    assert saved.comm_bytes_per_step == pytest.approx(by_axis, rel=1e-12)


# --- the seed's claims (FACTS §8) ---------------------------------------------------------------------

def test_t5_3b_in_4_3_gb_on_8_gpus_under_zero3_cannot_be():
    p = plan("t5-3b", gpus=8, gpu_memory="4.3GB", strategy="zero3", checkpointing="full")
    states = p.per_gpu()["model_state_bytes"]["total"]
    assert states >= 16 * 2_851_598_336 / 8 > 5.7e9 > 4.3e9  # model states alone, before any activation
    assert not p.fits
    best = p.advise()
    assert all(o.plan.total_bytes > 4.3e9 for o in best.does_not_fit if o.layout.offload == "none")


def test_what_gpt2_1_5b_needs_on_8_gpus_under_zero3():
    """The seed's 4.1 GB × 8: model states are 16Ψ/8 = 3.1 GB, so it is tight — activations must be checkpointed."""
    small_buckets = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 20_000_000}}
    bare = plan("gpt2-1.5b", gpus=8, gpu_memory="4.1GB", deepspeed_config=small_buckets)
    assert bare.per_gpu()["model_state_bytes"]["total"] == pytest.approx(16 * 1_557_611_200 / 8, rel=1e-4)
    assert bare.convention.text(bare.memory.model_states.total) == "3.12 GB"
    assert bare.memory.activations > 4.1e9 and not bare.fits  # sequence 1024, one sequence: 9.2 GB of activations
    tight = plan("gpt2-1.5b", gpus=8, gpu_memory="4.1GB", deepspeed_config=small_buckets, checkpointing="full")
    assert tight.fits and tight.total_bytes > 0.9 * 4.1e9
    default_buckets = plan("gpt2-1.5b", gpus=8, gpu_memory="4.1GB", strategy="zero3", checkpointing="full")
    assert not default_buckets.fits  # DeepSpeed's default 5e8-element buckets alone take 2 GB


# --- layouts: TP, PP, offload, traffic ---------------------------------------------------------------

def test_zero3_sends_one_and_a_half_times_ddp_at_every_n():
    for n in (2, 8, 64):
        ddp = plan(params=1e9, gpus=n, strategy="ddp").comm_bytes_per_step["dp"]
        zero3 = plan(params=1e9, gpus=n, strategy="zero3").comm_bytes_per_step["dp"]
        assert zero3 == pytest.approx(1.5 * ddp)


def test_tensor_and_pipeline_parallel_plan():
    p = plan("llama-7b", gpus=32, parallel="tp=4,pp=4", strategy="zero1", micro_batches=8, micro_batch_size=1)
    assert p.layout.dp == 2 and p.layout.sp
    assert p.bubble["fraction_of_wall_time"] == pytest.approx(3 / 11)
    tp = [t for t in p.transfers if t.axis == "tp"][0]
    assert tp.bytes == theory.tp_bytes_sent_per_step(2048, 1, 4096, 4, 8, 8, 2) and tp.link == "intra-node"
    assert [t.link for t in p.transfers if t.axis == "pp"] == ["inter-node"]
    stage0, last = p.stages[0], p.stages[-1]
    layer = theory.transformer_layer_activation_bytes(2048, 1, 4096, 32, 4, True, ffn=11008, dropout=False,
                                                      mlp="swiglu")
    assert stage0.activations == pytest.approx(4 * 8 * layer)  # 1F1B: stage 0 stashes min(p, m) = 4
    assert last.activations == pytest.approx(8 * layer + theory.output_activation_bytes(2048, 1, 4096, 32000, 4,
                                                                                        True))
    with_pp_zero3 = plan("llama-7b", gpus=32, parallel="tp=4,pp=4", strategy="zero3")
    assert any("refuses ZeRO-2 and ZeRO-3 with pipeline" in note for note in with_pp_zero3.notes)


def test_offload_moves_the_optimizer_to_the_host():
    p = plan("llama-7b", gpus=8, strategy="zero2", offload="optimizer")
    psi = p.model.param_count
    assert p.memory.model_states.params == 2 * psi and p.memory.model_states.optimizer == 0
    assert p.host_bytes_per_node == pytest.approx(8 * 14 * math.ceil(psi / 8))
    assert p.comm_bytes_per_step["host"] == theory.offload_traffic_bytes(math.ceil(psi / 8), 2)


def test_advisor_ranks_what_fits_by_communication_time_and_says_why_the_rest_does_not():
    advice = plan(params=7.5e9, gpus=64).advise()
    # HSDP (ZeRO-3 inside each node, the gradient shard all-reduced across the 8 nodes) sends least across nodes
    assert advice.fits[0].label == "HSDP (groups of 8), dp=64"
    assert advice.fits[1].reason.startswith("ZeRO-2, dp=64: 17.6 GB of 80 GB; same traffic as DDP")
    seconds = [o.plan.comm_seconds for o in advice.fits]
    assert seconds == sorted(seconds)
    assert [o.reason for o in advice.does_not_fit] == ["DDP, dp=64: needs 135 GB of 80 GB — model states alone are "
                                                       "120 GB"]
    # nothing fits on dp alone: the advisor tries tensor and pipeline parallelism, keeping the sequences per step
    big = plan("llama3-70b", gpus=16, checkpointing="full", host_memory=200e9).advise()
    assert big.fits and all(o.layout.tp > 1 or o.layout.pp > 1 for o in big.fits)
    assert all(o.layout.dp * o.layout.micro_batches == 16 for o in big.fits)
    offloaded = [o for o in big.does_not_fit if o.layout.offload != "none" and o.plan.total_bytes < 80e9]
    assert offloaded and all("fits the GPU, but the host needs" in o.reason for o in offloaded)


# --- the CLI and its JSON -----------------------------------------------------------------------------

def test_cli_plan_prints_the_table_and_the_advisor(capsys):
    assert main(["plan", "--params", "7.5e9", "--gpus", "64", "--strategy", "zero1"]) == 0
    out = capsys.readouterr().out
    assert "31.4 GB" in out and "K·Ψ/N, K = 12" in out and "estimate" in out and "advisor" in out


def test_cli_plan_json_has_the_keys_scripts_read(capsys):
    assert main(["plan", "--preset", "llama-7b", "--gpus", "16", "--strategy", "zero3", "--checkpointing", "full",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    per_gpu = data["per_gpu"]
    assert set(per_gpu["model_state_bytes"]) == {"params", "grads", "optimizer", "total"}
    for key in ("activation_bytes", "buffer_bytes", "total_bytes", "fits", "comm_bytes_per_step"):
        assert key in per_gpu
    assert per_gpu["total_bytes"] == pytest.approx(per_gpu["model_state_bytes"]["total"] + per_gpu[
        "activation_bytes"] + per_gpu["buffer_bytes"])
    assert set(per_gpu["comm_bytes_per_step"]) == {"dp"} and data["advisor"]["fits"]
    assert all(term["formula"] for term in data["terms"])


def test_cli_plan_answers_for_a_deepspeed_config(tmp_path, capsys):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
                                  "bf16": {"enabled": True}, "zero_optimization": {
                                      "stage": 3, "offload_optimizer": {"device": "cpu"},
                                      "stage3_max_live_parameters": 1e9}}))
    assert main(["plan", "--preset", "llama-13b", "--gpus", "8", "--deepspeed-config", str(config), "--json",
                 "--no-advice"]) == 0
    layout = json.loads(capsys.readouterr().out)["layout"]
    assert (layout["strategy"], layout["offload"], layout["micro_batch_size"], layout["micro_batches"]) == \
        ("zero3", "optimizer", 2, 4)
    assert main(["plan", "--preset", "llama-13b", "--deepspeed-config", str(config), "--strategy", "zero2"]) == 2
    assert "contradicts the DeepSpeed config" in capsys.readouterr().err


# --- bad input ----------------------------------------------------------------------------------------

BAD = [
    (["--params", "0"], "--params: params='0' must be a positive number"),
    (["--params=-7e9"], "--params: params='-7e9' must be a positive number"),
    (["--params", "lots"], "is not a number"),
    (["--preset", "gpt5"], "allowed: gpt2-1.5b, t5-3b, llama-7b"),
    (["--preset", "llama-7b", "--gpus", "0"], "--gpus 0: must be a positive whole number"),
    (["--preset", "llama-7b", "--micro-batch-size", "0"], "--micro-batch-size 0"),
    (["--preset", "llama-7b", "--gpu-memory", "-80"], "--gpu-memory"),
    (["--preset", "llama-7b", "--gpus", "8", "--parallel", "tp=3"], "--parallel: parallel: cp × tp × pp = 3 does not "
                                                                    "divide the world size 8"),
    (["--preset", "gpt2-1.5b", "--gpus", "8", "--parallel", "tp=2"], "--parallel: tp=2 does not divide the 25 "
                                                                     "attention heads"),
    (["--preset", "t5-3b", "--gpus", "7", "--parallel", "pp=7"], "pp=7 does not divide the 48 layers"),
    (["--preset", "llama-7b", "--parallel", "dp=2,tp=2"], "multiply to the number of ranks"),
    (["--preset", "llama-7b", "--parallel", "ep=2"], "not AXIS=N"),
    (["--preset", "llama-7b", "--checkpointing", "half"], "--checkpointing: checkpointing='half'"),
    (["--preset", "llama-7b", "--strategy", "ddp", "--offload", "optimizer"], "--offload"),
    (["--preset", "llama-7b", "--strategy", "zero2", "--offload", "params"], "ZeRO-3 only"),
    (["--params", "7e9", "--parallel", "tp=2"], "a bare parameter count has no layers"),
    (["--preset", "llama-7b", "--params", "7e9"], "name the model once"),
    (["--layers", "4", "--hidden", "100", "--heads", "3"], "hidden=100 is not divisible by heads=3"),
    (["--layers", "0", "--hidden", "64", "--heads", "4"], "layers=0 must be a positive whole number"),
]


@pytest.mark.parametrize("argv, message", BAD)
def test_bad_input_is_a_clear_usage_error(argv, message, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zerokit: error: ") and message in err, err


@pytest.mark.parametrize("config, message", [
    ({"zero_optimization": {"stage": 2}, "pipeline": {"stages": 4}}, "key 'pipeline' is unknown to the planner"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket": 5e8}}, "zero_optimization.reduce_bucket is unknown"),
    ({"zero_optimization": {"stage": 5}}, "not a ZeRO stage"),
    ({"zero_optimization": {"stage": 2}, "train_batch_size": 30}, "train_batch_size=30 but"),
])
def test_bad_deepspeed_configs_are_refused_with_the_key(tmp_path, capsys, config, message):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    assert main(["plan", "--preset", "llama-7b", "--deepspeed-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zerokit: error: --deepspeed-config") and message in err, err


# --- the course panel ---------------------------------------------------------------------------------

def test_plan_panel_replans_when_a_control_changes():
    pytest.importorskip("ipywidgets")
    from zerokit import course

    panel = course.PlanPanel("llama-7b", gpus=8, gpu_memory_gb=80, strategy="zero3", checkpointing="full")
    assert panel.draws == 1 and bytes(panel.image.value).startswith(b"\x89PNG") and panel.chosen.fits
    assert set(panel.plans) == set(STAGES) and "K·Ψ/N" in panel.details.value
    panel.preset.value = "gpt3-175b"
    assert panel.draws == 2 and not panel.chosen.fits and "does not fit" in panel.status.value
    panel.gpus.value = 1024
    assert panel.chosen.fits and panel.chosen.cluster.gpus == 1024
    panel.strategy.value = "ddp"
    assert panel.chosen.layout.strategy == "ddp" and not panel.chosen.fits
    panel.gpu_memory.value = 16
    assert panel.chosen.cluster.gpu_memory == 16e9 and panel.draws == 5 and panel.last_error is None
    assert "interactive panel" in repr(panel)
