"""The planner's step time, held against hand counts and against two papers' published tables.

Hand counts: each term of :mod:`zerokit.theory.step_time` and of a tiny plan's estimate
(FLOPs, compute, the data-parallel window, exposed traffic, bubble, step, MFU) is worked out
in the test's docstring and compared exactly (to float rounding).

Published tables (every figure below is copied from the paper, table and row named):

- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM" (SC'21, arXiv 2104.04473), Table 1 (weak scaling, 1.7 B → 1 T: achieved teraFLOP/s
  per GPU) and Table 2 (PTD parallelism rows: strong scaling of the 175 B and 530 B models);
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv 2205.05198), Table 3 (configurations) and Table 5 (iteration time with full recomputation
  and with selective recomputation + sequence parallelism, MFU and HFU).

Both ran Megatron-LM on Selene: DGX A100 nodes of 8 GPUs (NVLink 3 and NVSwitch, 300 GB/s per GPU
each way; eight 200 Gb/s HDR InfiniBand cards per node, 25 GB/s per GPU) — the planner's default
cluster — at 312 TFLOP/s BF16/FP16 peak per GPU; sequence length 2048, vocabulary 51,200, GPT shapes
(tied embedding, learned positions, GeLU MLP of 4h).

The error allowed, 20 % on every row, and why: the estimate has one free number, the share of
peak the GPU reaches while computing, and takes the library's default
(:data:`zerokit.theory.DEFAULT_COMPUTE_FRACTION`, 0.57) for every row of both papers, neither
per row nor per paper. The papers' own share rises with the model's width (Table 1: 44 % of peak
at 1.7 B, 52 % at 1 T; Korthikanti: 43.7 % HFU at 22 B, 57 % at 1 T) because wider matrices run
closer to peak, which the estimate does not model: its largest errors are +15.6 % (Table 1's
1.7 B row) and −17 % (Korthikanti's 530 B row with full recomputation). Where the compute fraction
cancels — the ratio of two rows of one series — the estimate is held to 3 %.

What each term is worth, shown by dropping it: without the communication term the 18.4 B row of
Table 1 (tp = 8 over a 6144-wide model) and Korthikanti's 22 B row come out 30 % and more too fast;
without the bubble, Table 2's strong-scaling series (more GPUs, fewer micro-batches per pipeline,
(p − 1)/m from 3 % to 12 %) comes out flat instead of falling 8 %, off by 7 %. (The bubble cannot
be seen in the absolute bound: it grows with model size in these tables, as the compute fraction
does, so dropping both moves the large rows together.)
"""
import math

import pytest

from zerokit import theory
from zerokit.planner import plan, transformer
from zerokit.planner.step_time import estimate, flop_counts
from zerokit.theory import step_time as st

A100 = 312e12
SEQ, VOCAB = 2048, 51200
BOUND = 0.20
RATIO_BOUND = 0.03


# --- theory: each term by hand -------------------------------------------------------------------------

def test_flops_per_token_by_hand():
    """L = 2 layers, s = 8, d = 16, Ψ = 1000 (800 of it in the layers):
    attention 12·2·8·16 = 3072; model 6·1000 + 3072 = 9072; the attention core's forward again
    (selective) 3072/3 = 1024 → 10096; the layers' forward again (full) 2·800 + 1024 → 11696."""
    assert st.attention_flops_per_token(2, 8, 16) == 3072
    assert st.model_flops_per_token(1000, 2, 8, 16) == 9072
    assert st.hardware_flops_per_token(1000, 2, 8, 16, "none") == 9072
    assert st.hardware_flops_per_token(1000, 2, 8, 16, "selective", 800) == 10096
    assert st.hardware_flops_per_token(1000, 2, 8, 16, "full", 800) == 11696
    assert st.model_flops_per_token(1000) == 6000  # 6Ψ alone: theory.training_flops_per_token's
    assert st.model_flops_per_token(1000) == theory.training_flops_per_token(1000)


def test_compute_window_exposed_step_and_utilisation_by_hand():
    """compute: 312e12 FLOPs at 0.5 of 312e12 FLOP/s = 2 s.
    window (backward 3 s, forward 1.5 s, m = 4): DDP and ZeRO-1 the last micro-batch's backward 3/4 = 0.75 s,
    ZeRO-2 every backward 3 s, ZeRO-3 all compute 4.5 s. exposed: 1 − 0.25 = 0.75; 1 − 2 → 0.
    step: 10 s pipelined × (1 + 1/8) + 0.5 s after = 11.75 s. utilisation: 312e12 FLOPs in 1 s on 1 GPU
    of 312e12 → 1; in 2 s on 4 GPUs → 1/8."""
    assert st.compute_seconds(312e12, A100, 0.5) == 2.0
    assert [st.dp_overlap_window(3.0, 1.5, 4, stage) for stage in range(4)] == [0.75, 0.75, 3.0, 4.5]
    assert st.exposed_seconds(1.0, 0.25) == 0.75 and st.exposed_seconds(1.0, 2.0) == 0.0
    assert st.step_seconds(10.0, 1 / 8, 0.5) == 11.75
    assert st.flops_utilization(312e12, 1.0, 1, A100) == 1.0
    assert st.flops_utilization(312e12, 2.0, 4, A100) == 1 / 8
    assert st.gpu_peak_flops("A100") == A100 and st.gpu_peak_flops("h100") == 989e12
    assert st.gpu_peak_flops(1e15) == 1e15


def test_palm_mfu_formula_gives_table_3s_figure():
    """Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways" (arXiv 2204.02311), Table 3 and
    App. B: PaLM 540B (N = 540.35 B, L = 118, H = 48 heads of Q = 256, T = 2048) on 6144 TPU v4 chips of
    275 TFLOP/s at 238.3 K tokens/s: MFU 46.2 %. Its 6N + 12·L·H·Q·T per token is model_flops_per_token."""
    per_token = st.model_flops_per_token(540.35e9, 118, 2048, 48 * 256)
    assert per_token == 6 * 540.35e9 + 12 * 118 * 48 * 256 * 2048
    assert st.flops_utilization(per_token * 238.3e3, 1.0, 6144, 275e12) == pytest.approx(0.462, abs=0.0005)


@pytest.mark.parametrize("call, match", [
    (lambda: st.compute_seconds(1.0, A100, 0), "compute_fraction=0"),
    (lambda: st.compute_seconds(1.0, A100, 1.5), "compute_fraction=1.5"),
    (lambda: st.compute_seconds(1.0, A100, True), "compute_fraction=True"),
    (lambda: st.compute_seconds(1.0, 0, 0.5), "peak_flops=0"),
    (lambda: st.gpu_peak_flops("b300"), "gpu_peak='b300'; allowed: a100"),
    (lambda: st.check_overlap("all"), "overlap='all'; allowed: none"),
    (lambda: st.hardware_flops_per_token(1.0, recompute="partial"), "recompute='partial'; allowed"),
    (lambda: st.dp_overlap_window(1.0, 1.0, 0, 1), "micro_batches=0"),
    (lambda: st.exposed_seconds(-1.0), "comm_seconds=-1.0"),
    (lambda: st.model_flops_per_token(0), "psi=0"),
])
def test_bad_input_is_refused_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- the planner's estimate on a tiny plan, by hand --------------------------------------------------------

def _tiny(layers=2):
    """2 layers, h = 64, 4 heads, FFN 256, vocabulary 128 tied, s = 16, no biases, RMSNorm, rotary positions.
    Ψ per layer: norms 64 + 64, QKV 64·192 = 12,288, projection 4,096, MLP 64·256 + 256·64 = 32,768 → 49,280;
    two layers 98,560; embedding 128·64 = 8,192 (tied: it is the head, it multiplies); final norm 64:
    Ψ = 106,816, all multiplying. Per token: 6Ψ = 640,896, attention 12·2·16·64 = 24,576 → 665,472."""
    return transformer(layers, 64, 4, ffn=256, vocab=128, seq_len=16, tied=True, bias=False, norm="rmsnorm",
                       position="rotary", name="tiny")


def test_tiny_data_parallel_plan_by_hand():
    """dp = 2 GPUs on two nodes (10 MB/s, no latency), DDP, micro-batch 1 × 2: 64 tokens a step.
    model FLOPs 64 · 665,472 = 42,590,208; per GPU 21,295,104 at 0.5 × 1 GFLOP/s → compute 0.042590208 s.
    dp: an all-reduce of 2·(1/2)·Ψ·2 B = 213,632 B in one call → 0.0213632 s. Window (DDP: the last
    micro-batch's backward): ⅔ · compute / 2 = 0.014196736 s → exposed 0.007166464 s.
    step 0.049756672 s; 64 / step tokens/s; MFU 42,590,208 / (step · 2 · 1e9) = 0.42798…
    overlap none: step = compute + 0.0213632 = 0.063953408 s."""
    p = plan(_tiny(), gpus=2, gpus_per_node=1, strategy="ddp", micro_batch_size=1, micro_batches=2,
             inter_bandwidth=1e7, inter_latency=0.0, gpu_peak=1e9, compute_fraction=0.5)
    assert flop_counts(p.model)[0] == p.model.param_count == 106_816
    est = p.step_time
    assert est.tokens_per_step == 64
    assert est.model_flops_per_step == est.hardware_flops_per_step == 42_590_208
    assert est.compute_seconds == pytest.approx(0.042590208, rel=1e-12)
    (dp,) = est.axes
    assert dp.axis == "dp" and dp.seconds == pytest.approx(0.0213632, rel=1e-12)
    assert dp.exposed_seconds == pytest.approx(0.007166464, rel=1e-9)
    assert est.step_seconds == pytest.approx(0.049756672, rel=1e-9)
    assert est.tokens_per_second == pytest.approx(64 / 0.049756672, rel=1e-9)
    assert est.mfu == pytest.approx(42_590_208 / (0.049756672 * 2 * 1e9), rel=1e-9)
    assert estimate(p, gpu_peak=1e9, compute_fraction=0.5, overlap="none").step_seconds == pytest.approx(
        0.063953408, rel=1e-9)
    out = p.to_dict(advice=False)["step_time_estimate"]
    assert out["step_seconds_estimate"] == est.step_seconds and out["mfu_estimate"] == est.mfu
    assert "step time — estimated, not measured" in p.table(advice=False)


def test_tiny_pipeline_plan_by_hand():
    """The same layers, 4 of them: Ψ = 4·49,280 + 8,192 + 64 = 205,376; per token 6Ψ = 1,232,256 + attention
    12·4·16·64 = 49,152 → 1,281,408. pp = 2 in one node (10 MB/s, no latency), micro-batch 1 × 4: 64 tokens,
    82,010,112 FLOPs, 41,005,056 per GPU at 0.5 GFLOP/s → compute 0.082010112 s. The fullest stage sends one
    way m·s·b·h·2 B = 4·16·64·2 = 8,192 B → 0.0008192 s, exposed. Bubble (p − 1)/m = 1/4: step
    (0.082010112 + 0.0008192) · 1.25 = 0.10353664 s; interleaved, v = 2 (one layer per chunk): · 1.125 =
    0.093182976 s. Full recomputation adds the layers' forward, per token 2·197,120 + 4·4·16·64 = 410,624
    → 64 · 410,624 = 26,279,936 hardware FLOPs more, model FLOPs unchanged."""
    p = plan(_tiny(4), gpus=2, parallel={"pp": 2}, micro_batch_size=1, micro_batches=4, intra_bandwidth=1e7,
             intra_latency=0.0, gpu_peak=1e9, compute_fraction=0.5)
    est = p.step_time
    assert est.model_flops_per_step == 82_010_112
    assert est.compute_seconds == pytest.approx(0.082010112, rel=1e-12)
    (pp,) = est.axes
    assert pp.axis == "pp" and pp.seconds == pp.exposed_seconds == pytest.approx(0.0008192, rel=1e-12)
    assert est.bubble_over_ideal == 0.25
    assert est.step_seconds == pytest.approx(0.10353664, rel=1e-9)
    assert est.bubble_seconds == pytest.approx(0.25 * (0.082010112 + 0.0008192), rel=1e-9)
    v2 = estimate(p, gpu_peak=1e9, compute_fraction=0.5, virtual_stages=2)
    assert v2.step_seconds == pytest.approx(0.093182976, rel=1e-9)
    full = plan(_tiny(4), gpus=2, parallel={"pp": 2}, micro_batch_size=1, micro_batches=4, checkpointing="full",
                gpu_peak=1e9, compute_fraction=0.5).step_time
    assert full.recompute == "full" and full.model_flops_per_step == est.model_flops_per_step
    assert full.hardware_flops_per_step - full.model_flops_per_step == 26_279_936
    with pytest.raises(ValueError, match="virtual_stages=3"):
        estimate(p, virtual_stages=3)


def test_a_mixture_of_experts_counts_its_active_experts():
    """Mixtral 8x7B (Jiang et al. 2024, arXiv 2401.04088): 12.9 B active parameters per token (2 of 8 experts),
    its 32000 × 4096 input embedding among them; 6Ψ counts the active ones that multiply."""
    p = plan(preset="mixtral-8x7b", gpus=8)
    psi, _, _, _ = flop_counts(p.model)
    assert psi + 32000 * 4096 == pytest.approx(12.9e9, rel=0.01)


def test_bare_count_has_no_estimate_and_bad_options_are_refused_at_plan():
    assert plan(params=7e9, gpus=8).step_time is None
    assert plan(params=7e9, gpus=8).to_dict(advice=False)["step_time_estimate"] is None
    for bad, match in ((dict(compute_fraction=2), "compute_fraction=2"), (dict(overlap="some"), "overlap='some'"),
                       (dict(gpu_peak="tpu"), "gpu_peak='tpu'"), (dict(virtual_stages=0), "virtual_stages=0")):
        with pytest.raises(ValueError, match=match):
            plan(preset="llama-7b", gpus=8, **bad)
        with pytest.raises(ValueError, match=match):
            plan(params=7e9, gpus=8, **bad)


def test_cli_prints_the_estimate_and_names_the_flag(capsys):
    from zerokit.cli import main
    assert main(["plan", "--preset", "llama-7b", "--gpus", "16", "--parallel", "dp=4,pp=4", "--micro-batches", "16",
                 "--virtual-stages", "2", "--gpu-peak", "989", "--compute-fraction", "0.4", "--overlap", "none",
                 "--no-advice"]) == 0
    out = capsys.readouterr().out
    assert "step time — estimated, not measured (peak 989 TFLOP/s per GPU at 0.4 of it" in out
    assert "(p − 1)/(v·m) = 0.0938" in out and "MFU" in out
    for argv, flag in ((["--compute-fraction", "1.2"], "--compute-fraction: compute_fraction=1.2"),
                       (["--gpu-peak", "b300"], "--gpu-peak: gpu_peak='b300'"),
                       (["--virtual-stages", "2"], "--virtual-stages: virtual_stages=2")):
        assert main(["plan", "--preset", "llama-7b", "--no-advice", *argv]) == 2
        assert flag in capsys.readouterr().err


# --- the published tables ------------------------------------------------------------------------------------

def _gpt(layers, hidden, heads):
    return transformer(layers, hidden, heads, vocab=VOCAB, seq_len=SEQ, tied=True, name=f"gpt-{layers}x{hidden}")


#: Narayanan et al. 2021, Table 1, every row: (params (B), heads, hidden, layers, t, p, GPUs, batch, achieved
#: teraFLOP/s per GPU). Table 1 gives no micro-batch size or schedule: taken as 1 and non-interleaved 1F1B
NARAYANAN_TABLE_1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163)]

#: Narayanan et al. 2021, Table 2, the "PTD Parallelism" rows (micro-batch size 1, as the table gives):
#: (params (B), layers, hidden, heads, t, p, batch, [(GPUs, achieved teraFLOP/s per GPU), …]); model-parallel
#: size 96 = t 8 × p 12 for 175 B, 280 = 8 × 35 for 530 B (Table 1's shape)
NARAYANAN_TABLE_2 = [
    (174.6, 96, 12288, 96, 8, 12, 1536, [(384, 153), (768, 149), (1536, 141)]),
    (529.6, 105, 20480, 128, 8, 35, 2240, [(560, 171), (1120, 167), (2240, 159)])]

#: Korthikanti et al. 2022, Table 3 (heads, hidden, layers, t, p, GPUs, global batch; micro-batch 1, one data-
#: parallel replica) and Table 5 (iteration seconds with full recomputation, with selective recomputation and
#: sequence parallelism; MFU and HFU of the latter)
KORTHIKANTI = {
    "22B": (64, 6144, 48, 8, 1, 8, 4, 1.42, 1.10, 0.415, 0.437),
    "175B": (96, 12288, 96, 8, 8, 64, 64, 18.13, 13.75, 0.514, 0.528),
    "530B": (128, 20480, 105, 8, 35, 280, 280, 49.05, 37.83, 0.560, 0.570),
    "1T": (160, 25600, 128, 8, 64, 512, 512, 94.42, 71.49, 0.563, 0.570)}


def _narayanan(layers, hidden, heads, t, p, gpus, batch, **options):
    """Megatron-LM as Narayanan et al. ran it: full recomputation, micro-batch 1, gradients all-reduced after the
    backward (overlap none: their data-parallel reduction was not overlapped in 2021)."""
    d = gpus // (t * p)
    layout = plan(_gpt(layers, hidden, heads), gpus=gpus, parallel={"dp": d, "tp": t, "pp": p}, micro_batch_size=1,
                  micro_batches=batch // d, checkpointing="full", gpu_memory=1e15)
    return estimate(layout, gpu_peak="a100", overlap="none", **options)


def _tflops(est) -> float:
    return est.achieved_flops_per_gpu / 1e12


def _without_comm(est) -> float:
    """Achieved TFLOP/s per GPU with every transfer taken out: compute · (1 + bubble)."""
    return est.hardware_flops_per_step / est.gpus / (est.compute_seconds * (1 + est.bubble_over_ideal)) / 1e12


def _without_bubble(est) -> float:
    return est.hardware_flops_per_step / est.gpus / (est.step_seconds - est.bubble_seconds) / 1e12


def test_the_flops_are_megatrons_formula():
    """Narayanan et al. 2021 §5.1: hardware FLOPs per step 96·B·s·l·h²·(1 + s/6h + V/16lh) with full
    recomputation, model FLOPs 72·B·s·l·h²·(1 + s/6h + V/12lh) (Korthikanti et al. 2022 §6.3's MFU); the
    estimate counts the norms' and biases' weights too, 0.05 % more at 1.7 B."""
    for params, heads, hidden, layers, t, p, gpus, batch, _ in NARAYANAN_TABLE_1:
        est = _narayanan(layers, hidden, heads, t, p, gpus, batch)
        base = batch * SEQ * layers * hidden ** 2
        assert est.hardware_flops_per_step == pytest.approx(
            96 * base * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden)), rel=5e-4)
        assert est.model_flops_per_step == pytest.approx(
            72 * base * (1 + SEQ / (6 * hidden) + VOCAB / (12 * layers * hidden)), rel=5e-4)
        assert _gpt(layers, hidden, heads).param_count / 1e9 == pytest.approx(params, abs=0.05)


def test_narayanan_table_1_every_row_within_the_bound():
    errors = {}
    for params, heads, hidden, layers, t, p, gpus, batch, published in NARAYANAN_TABLE_1:
        est = _narayanan(layers, hidden, heads, t, p, gpus, batch)
        errors[params] = _tflops(est) / published - 1
        assert abs(errors[params]) <= BOUND, (params, _tflops(est), published)
    assert max(errors.values()) == pytest.approx(0.156, abs=0.01)  # the 1.7 B row: small matrices
    # without the communication term, the 18.4 B row (tp = 8 on h = 6144) is far out
    params, heads, hidden, layers, t, p, gpus, batch, published = NARAYANAN_TABLE_1[3]
    est = _narayanan(layers, hidden, heads, t, p, gpus, batch)
    assert _without_comm(est) / published - 1 > BOUND + 0.1


def test_narayanan_table_2_strong_scaling_follows_the_bubble():
    """More GPUs for the same batch: dp doubles, m = batch/dp halves, the bubble (p − 1)/m doubles. The
    compute fraction cancels in each row's ratio to its series' first: held to 3 %; without the bubble
    the estimate stays flat and misses the last row's ratio by 7 %."""
    for params, layers, hidden, heads, t, p, batch, rows in NARAYANAN_TABLE_2:
        assert _gpt(layers, hidden, heads).param_count / 1e9 == pytest.approx(params, abs=0.05)
        ests = [_narayanan(layers, hidden, heads, t, p, gpus, batch) for gpus, _ in rows]
        published = [tf for _, tf in rows]
        for est, tf in zip(ests, published):
            assert abs(_tflops(est) / tf - 1) <= BOUND, (params, est.gpus, _tflops(est), tf)
        for est, tf in zip(ests[1:], published[1:]):
            ratio, published_ratio = _tflops(est) / _tflops(ests[0]), tf / published[0]
            assert abs(ratio / published_ratio - 1) <= RATIO_BOUND, (params, est.gpus, ratio, published_ratio)
        flat = _without_bubble(ests[-1]) / _without_bubble(ests[0])
        assert abs(flat / (published[-1] / published[0]) - 1) > 2 * RATIO_BOUND, (params, flat)


def _korthikanti(name, recompute, **options):
    heads, hidden, layers, t, p, gpus, batch = KORTHIKANTI[name][:7]
    layout = plan(_gpt(layers, hidden, heads), gpus=gpus, parallel={"dp": 1, "tp": t, "pp": p}, micro_batch_size=1,
                  micro_batches=batch, checkpointing="full" if recompute == "full" else "none", gpu_memory=1e15)
    return estimate(layout, gpu_peak="a100", recompute=recompute, **options)


def test_korthikanti_table_5_iteration_times_and_mfu_within_the_bound():
    """Full recomputation and selective recomputation (the attention core only, with sequence parallelism):
    the estimated iteration's throughput within 20 % of Table 5's, and its MFU and HFU likewise; the
    estimate's model FLOPs are the paper's (72·B·s·l·h²·(1 + s/6h + V/12lh), within 0.05 %), so MFU's error
    is the iteration time's."""
    for name, row in KORTHIKANTI.items():
        full_s, selective_s, mfu, hfu = row[7:]
        full, selective = _korthikanti(name, "full"), _korthikanti(name, "selective")
        assert abs(full_s / full.step_seconds - 1) <= BOUND, (name, full.step_seconds, full_s)
        assert abs(selective_s / selective.step_seconds - 1) <= BOUND, (name, selective.step_seconds, selective_s)
        assert abs(selective.mfu / mfu - 1) <= BOUND, (name, selective.mfu, mfu)
        assert abs(selective.hfu / hfu - 1) <= BOUND, (name, selective.hfu, hfu)
        published_mfu = selective.model_flops_per_step / (selective_s * selective.gpus * A100)
        assert published_mfu == pytest.approx(mfu, abs=0.003)  # the paper's MFU is its iteration time's
    # the communication term matters: without it the 22 B row (tp = 8, batch 4) is far out
    sel = _korthikanti("22B", "selective")
    no_comm = sel.compute_seconds * (1 + sel.bubble_over_ideal)
    assert KORTHIKANTI["22B"][8] / no_comm - 1 > BOUND + 0.1


def test_the_default_compute_fraction_is_the_fit_the_bounds_rest_on():
    """The default is stated, not tuned per row: one number for the rows above (Table 1 and Korthikanti's
    eight iterations); 0.57 gives the smallest largest error of its neighbours, and a lower or a higher
    one (± 0.05) puts some row out of the 20 % bound."""
    assert theory.DEFAULT_COMPUTE_FRACTION == 0.57

    def worst(fraction):
        out = []
        for _, heads, hidden, layers, t, p, gpus, batch, published in NARAYANAN_TABLE_1:
            est = _narayanan(layers, hidden, heads, t, p, gpus, batch, compute_fraction=fraction)
            out.append(abs(_tflops(est) / published - 1))
        for name, row in KORTHIKANTI.items():
            for recompute, published in (("full", row[7]), ("selective", row[8])):
                est = _korthikanti(name, recompute, compute_fraction=fraction)
                out.append(abs(published / est.step_seconds - 1))
        return max(out)

    assert worst(0.57) <= BOUND
    assert worst(0.52) > BOUND and worst(0.62) > BOUND
    assert math.isclose(worst(0.57), min(worst(0.57), worst(0.56), worst(0.58)))
