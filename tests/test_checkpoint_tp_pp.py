"""Sharded checkpoints under tensor and pipeline parallelism, through zerokit.train(save_dir=, save_every=,
resume_from=): a run saved at step 2 under tp=2, pp=2 or dp only resumes under the same or another layout (also
the 2×2×2 grid) and its losses are the uninterrupted run's; the whole state comes out as one plain state dict
(the tied embedding/head of the first and last stage as one tensor), and as a torch DCP checkpoint."""
import json

import pytest
import torch

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
    """Uninterrupted runs under dp=2, tp=2 and pp=2, each saving after steps 2 and 4."""
    root = tmp_path_factory.mktemp("runs")
    return {name: (run(name, save_dir=str(root / name), save_every=SAVED), root / name) for name in ("dp", "tp", "pp")}


def _max_diff(a, b):
    assert len(a) == len(b) == STEPS
    return max(abs(x - y) for x, y in zip(a, b))


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


@pytest.mark.parametrize("source,target", [("tp", "tp"), ("pp", "pp"), ("tp", "dp"), ("pp", "dp-zero3"),
                                           ("dp", "tp"), ("dp", "pp")])
def test_resume_continues_the_uninterrupted_run(runs, source, target):
    """Same layout: the losses bit for bit; another layout (tp=2 -> dp only, pp=2 -> zero3, dp -> tp/pp): ≤ 1e-6."""
    reference = runs[source][0].losses
    result = run(target, resume_from=str(runs[source][1] / "step-000002"))
    resumed = result.losses
    assert resumed[:SAVED] == reference[:SAVED]  # the steps before the checkpoint: its saved losses
    if source == target:
        assert resumed == reference
        # the ledgers hold the steps this call ran, per step as in the uninterrupted run (the saves: setup)
        assert [r.comm_payload_bytes_per_step for r in result.ranks] == \
            [r.comm_payload_bytes_per_step for r in runs[source][0].ranks]
    assert _max_diff(resumed, reference) <= 1e-6, (resumed, reference)
    assert _max_diff(resumed, runs["dp" if target.startswith("dp") else target][0].losses) <= 1e-6


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
        # another layout's run sums in another order; Adam turns that into ~1e-6 parameter differences
        assert max(float((state[k] - final["dp"][k]).abs().max()) for k in state) <= 1e-5


def test_the_grid_resumes_a_dp_checkpoint_and_saves_its_own(runs, tmp_path):
    """2×2×2 (pp × dp × tp, zero1 on dp) from the dp-only checkpoint; its own checkpoint, exported, is the
    dp-only run's final model."""
    dp, directory = runs["dp"]
    grid = run("grid", resume_from=str(directory / "step-000002"), save_dir=str(tmp_path / "grid"))
    assert _max_diff(grid.losses, dp.losses) <= 1e-6
    manifest = json.loads((tmp_path / "grid" / "step-000004" / "manifest.json").read_text())
    assert manifest["world_size"] == 8 and len(manifest["replicas"]) == 4 and manifest["stage"] == 1
    state = checkpoint.export_full_state_dict(tmp_path / "grid" / "step-000004")
    reference = checkpoint.export_full_state_dict(directory / "step-000004")
    assert state.keys() == reference.keys()
    assert max(float((state[k] - reference[k]).abs().max()) for k in state) <= 1e-6


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
