"""Sharded checkpoints under tensor and pipeline parallelism, through zerokit.train(save_dir=, save_every=,
resume_from=): a run saved at step 2 under tp=2, pp=2 or dp only resumes under the same or another layout (also
the 2×2×2 grid) and continues the uninterrupted run; the whole state comes out as one plain state dict (the tied
embedding/head of the first and last stage as one tensor), and as a torch DCP checkpoint.

What is compared, and how closely (float32, unit roundoff u = 2⁻²⁴, γ_k = k·u/(1 − k·u); the first-order model
of rounding: a value computed through a chain of k roundings is off by at most γ_k times the sum of the absolute
values of its terms):

* the same layout sums in the same order: a resumed run's losses are the uninterrupted run's, bit for bit;
* another layout sums in another order, and AdamW divides by √v̂ + ε: a gradient that is zero in exact arithmetic
  (the attention key bias: a constant added to every logit of a softmax row changes nothing) carries rounding noise
  of ~1e-12 in each layout, and AdamW turns noise into steps of up to ~lr (FACTS §10). Two layouts' AdamW parameters
  may then differ by ~1e-3 after a few steps (and the losses after them by what that does through rounding), so
  runs in two layouts are compared only where they hold the same numbers: the checkpoint's. Each AdamW step a run
  takes is checked against the same step computed here from the state it started from (:func:`_check_adamw_step`),
  with bounds in which nothing is divided by √v̂:
  - the loss of step t+1, computed by the run in float32 from the parameters after step t, is within
    γ_{K_FWD}·A of the float64 loss of those parameters: K_FWD ≥ the roundings along the longest chain from the
    parameters to the loss (counted at ``K_FWD``: 550), A = max ℓ_n + 2·max|z| ≥ the absolute terms of every
    token's ℓ_n = log Σ exp z − z_target (the mean of the positive ℓ_n adds no cancellation): ~1.4e-4 here;
  - the moments after the step: m′ = β₁m + (1−β₁)g and v′ = β₂v + (1−β₂)g² are linear in g and g², so with the
    run's float32 gradient within δ = γ_{K_GRAD}·G of the float64 one (K_GRAD: the backward chain mirrors the
    forward one, plus the sums over tokens, micro-batches, ranks, tp halves and the tied weight's two uses: 1140;
    G, the largest |∂ℓ_n/∂θ| of any one token in float64, bounds the terms of every summed gradient):
    |Δm′| ≤ (1−β₁)δ + 3u(|m| + |g| + δ) and |Δv′| ≤ (1−β₂)(2|g| + δ)δ + 4u(v + (1−β₂)(|g| + δ)²), the last terms
    for the roundings of torch's lerp_ and mul_ + addcmul_;
  - the parameters after the step are torch's AdamW update in float32 from the parameters before it and the run's
    own m′, v′: the same correctly rounded elementwise operations, so equal up to one rounding of the final addcdiv
    (fused or not in a vectorised loop): |Δp′| ≤ 2u|p′| + u|p′ − p|;
  - the step count is exact.
  A parameter loaded 1e-6 off fails the parameter check; moments lost, swapped between shards or 1 % off fail the
  moment checks; a skipped step fails the step count; a wrong batch fails the loss.
"""
import functools
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import zerokit
from zerokit import checkpoint
from zerokit.checkpoint import CheckpointError
from zerokit.workloads import tiny_gpt

STEPS, SAVED = 4, 2
LAYOUTS = {  # name: (strategy, parallel)
    "dp": ("ddp", {"dp": 2, "tp": 1, "pp": 1}),
    "tp": ("tp", {"dp": 1, "tp": 2, "pp": 1}),
    "pp": ("pp", {"dp": 1, "tp": 1, "pp": 2}),
    "dp-zero3": ("zero3", {"dp": 2, "tp": 1, "pp": 1}),
    "grid": ("zero1", {"dp": 2, "tp": 2, "pp": 2}),
}


# the bounds of the module docstring
U = 2.0 ** -24
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8  # zerokit.train's AdamW
D, HEAD_DIM, SEQ, VOCAB, LAYERS, TOKENS = 16, 8, 8, 32, 2, 4 * 8  # workload(): d_model, d/heads, …, batch·seq
# roundings along the longest chain from the parameters to the loss (a sum of k terms counts k):
# a block: 2 LayerNorms (mean, variance: 2·D, normalise and scale: 4), qkv (D + bias), attention (scores over
# HEAD_DIM, scale; softmax: shift, exp, sum over SEQ, divide; weighted sum over SEQ), proj (D + bias), the MLP's fc
# (D + bias), GELU (4), proj (4·D + bias), two residual adds; then the embeddings' add, ln_f, the head (D),
# log-sum-exp over VOCAB (+ shift, exp, log, minus the target) and the mean over ≤ TOKENS // 2 tokens (+ divide)
_BLOCK = 2 * (2 * D + 4) + (D + 1) + (HEAD_DIM + 1 + 1 + 1 + SEQ + 1 + SEQ) + (D + 1) + (D + 1) + 4 + (4 * D + 1) + 2
K_FWD = 1 + LAYERS * _BLOCK + (2 * D + 4) + D + (VOCAB + 4) + (TOKENS // 2 + 1)  # 550
# backward mirrors the forward chain; then the sums over the tokens, 2 micro-batches, 2 dp ranks, the tp halves
# and the tied weight's two uses
K_GRAD = 2 * K_FWD + TOKENS + 4 * 2


def gamma(k):
    return k * U / (1 - k * U)


def workload(d_model=16):
    # the embedding and the head share one tensor: under pp=2 the first and the last stage each hold it
    return tiny_gpt(vocab=32, seq_len=8, d_model=d_model, n_layer=2, n_head=2, batch_size=4, tie_weights=True)


def run(layout, **kw):
    strategy, parallel = LAYOUTS[layout]
    world = parallel["dp"] * parallel["tp"] * parallel["pp"]
    return zerokit.train(workload(), strategy, world, steps=STEPS, micro_batches=2, reference=False,
                         parallel=parallel, **kw).result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Uninterrupted runs under dp=2, tp=2 and pp=2, each saving after every step (1 to 4)."""
    root = tmp_path_factory.mktemp("runs")
    return {name: (run(name, save_dir=str(root / name), save_every=1), root / name) for name in ("dp", "tp", "pp")}


def _step_dir(directory, step):
    return str(Path(directory) / f"step-{step:06d}")


@functools.lru_cache(maxsize=None)
def _saved(directory):
    """(parameters, AdamW states) of a checkpoint; directory None: the model before step 1, zero states."""
    if directory is None:
        model = workload().build_model()  # as zerokit.train builds it
        zeros = {k: {"exp_avg": torch.zeros_like(v), "exp_avg_sq": torch.zeros_like(v), "step": torch.tensor(0.0)}
                 for k, v in model.named_parameters()}
        return {k: v.detach() for k, v in model.state_dict().items()}, zeros
    return checkpoint.export_full_state_dict(directory, optimizer_states=True)


@functools.lru_cache(maxsize=None)
def _exact(directory, step):
    """float64, at the parameters of ``directory`` and the batch of step ``step`` + 1: (the loss, A, the gradient
    by name, G) of the module docstring, A and G from each token's own loss and gradient."""
    model = workload().build_model().double()
    model.load_state_dict({k: v.double() for k, v in _saved(directory)[0].items()})
    x, y = workload().batch(step)
    logits = model(x)
    losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
    names, params = zip(*model.named_parameters())  # the tied head is the embedding: named once
    grad, largest = [torch.zeros_like(p) for p in params], 0.0
    for token_loss in losses:
        for total, g in zip(grad, torch.autograd.grad(token_loss, params, retain_graph=True)):
            total += g / losses.numel()
            largest = max(largest, float(g.abs().max()))
    size = float(losses.detach().max()) + 2 * float(logits.detach().abs().max())
    return float(losses.detach().mean()), size, dict(zip(names, grad)), largest


def _check_adamw_step(before, after, step, loss):
    """The checkpoint ``after`` is one AdamW step (step ``step`` + 1, whose loss the run reported as ``loss``)
    from the state in ``before`` (a checkpoint, or None: the model before step 1), within the module docstring's
    bounds."""
    (p0, s0), (p1, s1) = _saved(before), _saved(after)
    exact, size, grad, largest = _exact(before, step)
    assert abs(loss - exact) <= gamma(K_FWD) * size, (after, loss, exact, gamma(K_FWD) * size)
    delta = gamma(K_GRAD) * largest
    assert set(s1) == set(grad), (after, set(s1) ^ set(grad))
    for name, g in grad.items():
        m0, v0 = s0[name]["exp_avg"].double(), s0[name]["exp_avg_sq"].double()
        m1, v1 = s1[name]["exp_avg"], s1[name]["exp_avg_sq"]
        assert float(s1[name]["step"]) == step + 1, (after, name, s1[name]["step"])
        bound = (1 - BETA1) * delta + 3 * U * (m0.abs() + g.abs() + delta)
        assert bool(((m1.double() - (BETA1 * m0 + (1 - BETA1) * g)).abs() <= bound).all()), (after, name, "exp_avg")
        bound = (1 - BETA2) * (2 * g.abs() + delta) * delta + 4 * U * (v0 + (1 - BETA2) * (g.abs() + delta) ** 2)
        assert bool(((v1.double() - (BETA2 * v0 + (1 - BETA2) * g * g)).abs() <= bound).all()), (after, name,
                                                                                                 "exp_avg_sq")
        # torch.optim.AdamW's single-tensor step from p0 with the run's own m1, v1 (weight_decay 0)
        expected = p0[name].clone().addcdiv_(m1, (v1.sqrt() / (1 - BETA2 ** (step + 1)) ** 0.5).add_(EPS),
                                             value=-LR / (1 - BETA1 ** (step + 1)))
        bound = 2 * U * p1[name].abs() + U * (p1[name] - p0[name]).abs()
        assert bool(((expected - p1[name]).abs() <= bound).all()), (after, name, "parameters")


def _check_adamw_steps(losses, directories, first):
    """Steps ``first`` + 1, … of a run: ``directories`` the state before the first of them, then after each."""
    for step, (before, after) in enumerate(zip(directories, directories[1:]), start=first):
        _check_adamw_step(before, after, step, losses[step])


def test_the_manifest_records_the_layout(runs):
    tp = json.loads((runs["tp"][1] / "step-000002" / "manifest.json").read_text())
    assert tp["mesh"] == {"pp": 1, "dp": 1, "tp": 2} and tp["step"] == SAVED
    assert tp["params"]["blocks.0.attn.qkv.weight"] == {"shape": [48, 16], "shard": {"dim": 0, "blocks": 3},
                                                        "trainable": True}
    assert tp["params"]["blocks.0.attn.proj.weight"]["shard"] == {"dim": 1, "blocks": 1}  # row-parallel
    assert tp["params"]["tok.weight"]["shard"] == {"dim": 0, "blocks": 1}  # vocabulary-parallel
    assert [(r["tp"], r["segments"][0]["params"][0]["shape"]) for r in tp["replicas"]] == [(0, [16, 16]), (1, [16, 16])]
    pp = json.loads((runs["pp"][1] / "step-000002" / "manifest.json").read_text())
    stages = [{e["name"] for s in r["segments"] for e in s["params"]} for r in pp["replicas"]]
    assert stages[0] & stages[1] == {"tok.weight"}  # the tied weight, held by both ends
    assert "head.weight" not in pp["params"] and pp["tied"] == {"head.weight": "tok.weight"}
    assert sorted(p.name for p in (runs["pp"][1] / "step-000002").iterdir()) == [
        "manifest.json", "shard-00000-of-00002.pt", "shard-00001-of-00002.pt"]


def test_every_layout_takes_the_exact_adamw_steps(runs):
    """Each uninterrupted run's steps 1 to 4, from the model before step 1 to its checkpoint after each step: the
    losses, moments and parameters of the module docstring's bounds (which layouts cannot share: see there)."""
    for name, (result, directory) in runs.items():
        assert len(result.losses) == STEPS
        _check_adamw_steps(result.losses, [None] + [_step_dir(directory, s) for s in range(1, STEPS + 1)], 0)


@pytest.mark.parametrize("source,target", [("tp", "tp"), ("pp", "pp"), ("tp", "dp"), ("pp", "dp-zero3"),
                                           ("dp", "tp"), ("dp", "pp")])
def test_resume_continues_the_uninterrupted_run(runs, source, target, tmp_path):
    """Same layout: the losses bit for bit. Another layout (tp=2 -> dp only, pp=2 -> zero3, dp -> tp/pp): the
    saved losses, then steps 3 and 4 from the checkpoint's parameters and AdamW states within the module
    docstring's bounds (the uninterrupted run in the other layout is no reference for AdamW: see there)."""
    reference = runs[source][0].losses
    saves = {} if source == target else dict(save_dir=str(tmp_path / target), save_every=1)
    result = run(target, resume_from=_step_dir(runs[source][1], SAVED), **saves)
    resumed = result.losses
    assert len(resumed) == STEPS and resumed[:SAVED] == reference[:SAVED]  # before the checkpoint: its losses
    if source == target:
        assert resumed == reference
        # the ledgers hold the steps this call ran, per step as in the uninterrupted run (the saves: setup)
        assert [r.comm_payload_bytes_per_step for r in result.ranks] == \
            [r.comm_payload_bytes_per_step for r in runs[source][0].ranks]
    else:
        _check_adamw_steps(resumed, [_step_dir(runs[source][1], SAVED)] +
                           [_step_dir(tmp_path / target, s) for s in range(SAVED + 1, STEPS + 1)], SAVED)


def test_export_is_the_trained_model_and_the_tied_weight_is_one_tensor(runs):
    final = {name: checkpoint.export_full_state_dict(directory / "step-000004")
             for name, (_, directory) in runs.items()}
    for name, (result, _) in runs.items():  # train's own gathered parameters at the end of the run
        for key, value in result.ranks[0].params.items():
            assert torch.equal(final[name][key], value), (name, key)
    for name in ("tp", "pp"):
        state = final[name]
        assert state["head.weight"] is state["tok.weight"]
        model = workload().build_model()
        model.load_state_dict(state)  # a plain state dict of the unsharded model
        # the model the run trained: test_every_layout_takes_the_exact_adamw_steps checks each exported step
        # against the step from the one before (another layout's parameters differ by up to ~lr under AdamW)
        assert state.keys() == final["dp"].keys()


def test_the_grid_resumes_a_dp_checkpoint_and_saves_its_own(runs, tmp_path):
    """2×2×2 (pp × dp × tp, zero1 on dp) from the dp-only checkpoint; its own checkpoints after steps 3 and 4,
    exported, are the AdamW steps from the dp-only run's state after step 2 within the module docstring's bounds
    (not the dp-only run's parameters: AdamW turns the grid's other summation order into differences of up to
    ~lr in the attention key bias, whose exact gradient is zero)."""
    dp, directory = runs["dp"]
    grid = run("grid", resume_from=_step_dir(directory, SAVED), save_dir=str(tmp_path / "grid"), save_every=1)
    assert len(grid.losses) == STEPS and grid.losses[:SAVED] == dp.losses[:SAVED]
    manifest = json.loads((tmp_path / "grid" / "step-000004" / "manifest.json").read_text())
    assert manifest["world_size"] == 8 and len(manifest["replicas"]) == 4 and manifest["stage"] == 1
    state = checkpoint.export_full_state_dict(tmp_path / "grid" / "step-000004")
    reference = checkpoint.export_full_state_dict(directory / "step-000004")
    assert state.keys() == reference.keys()
    assert state["head.weight"] is state["tok.weight"]
    _check_adamw_steps(grid.losses, [_step_dir(directory, SAVED)] +
                       [_step_dir(tmp_path / "grid", s) for s in range(SAVED + 1, STEPS + 1)], SAVED)


def test_bad_input_names_the_argument(runs, tmp_path):
    saved = str(runs["tp"][1])
    cases = [
        (dict(resume_from=str(tmp_path / "nowhere")), CheckpointError, r"resume_from=.*nowhere.*does not exist"),
        (dict(resume_from=str(tmp_path)), CheckpointError, r"resume_from=.*neither manifest.json nor any step-"),
        (dict(resume_from=saved), ValueError, r"resume_from=.*is at step 4; steps=4 must be larger"),  # the latest
        (dict(resume_from=saved + "/step-000002", optimizer="sgd"), CheckpointError,
         r"resume_from=.*holds AdamW states; optimizer='sgd' here"),
        (dict(save_every=2), ValueError, r"save_every=2 needs save_dir"),
        (dict(save_dir=str(tmp_path), save_every=0), ValueError, r"save_every=0 must be a positive integer"),
        (dict(save_dir=3), ValueError, r"save_dir=3 must be a directory path"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            run("dp", **kwargs)
    with pytest.raises(CheckpointError, match=r"resume_from=.*'tok.weight' has shape \(32, 16\) there, \(32, 8\)"):
        zerokit.train(workload(d_model=8), "ddp", 2, steps=STEPS, reference=False,
                      resume_from=str(runs["tp"][1] / "step-000002"))


def test_export_dcp_reads_back_with_torch(runs, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    directory = runs["pp"][1] / "step-000004"
    checkpoint.export_dcp(directory, tmp_path / "dcp", optimizer_states=True)
    dcp_to_torch_save(tmp_path / "dcp", tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    state, optim = checkpoint.export_full_state_dict(directory, optimizer_states=True)
    assert whole["step"] == STEPS and set(whole["model"]) == set(state) - {"head.weight"}
    assert all(torch.equal(whole["model"][k], state[k]) for k in whole["model"])
    assert torch.equal(whole["optim"]["tok.weight"]["exp_avg_sq"], optim["tok.weight"]["exp_avg_sq"])
    with pytest.raises(ValueError, match="out=.*not empty"):
        checkpoint.export_dcp(directory, tmp_path / "dcp")
