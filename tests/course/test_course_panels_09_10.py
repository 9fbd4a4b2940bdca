"""The panels of lessons 09 (offload) and 10 (activation checkpointing), driven as a learner would.

A control change reruns the jobs (or the measurement) and redraws; what is drawn and
written comes from the ledgers — the memory ledger's device and host bytes, the transfer
ledger's copies, the saved-tensor hooks' activation bytes — and equals zerokit.theory where
the theory is exact; a refused combination is shown, not raised; nothing is printed.
"""
import pytest

pytest.importorskip("ipywidgets")

import zerokit  # noqa: E402
from zerokit import course, theory  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
STATES = ("params", "grads", "optimizer")


def picture(panel) -> bytes:
    return bytes(panel.image.value)


@pytest.fixture(scope="module")
def work():
    return zerokit.tiny_gpt(vocab=32, seq_len=8, d_model=16, n_layer=1, n_head=2, batch_size=12)


def test_offload_panel_reruns_on_a_change_and_draws_the_ledgers(work, capsys):
    panel = course.OffloadPanel(work, stage="zero2", offload="optimizer", world_sizes=(2, 3), steps=2)
    assert panel.runs == 1 and panel.last_error is None and picture(panel).startswith(PNG)
    base, off = panel.last_report.results
    assert (base.options["offload"], off.options["offload"]) == ("none", "optimizer")
    for result in (base, off):
        for rank in result.ranks:
            host = rank.theory_model_states.get("host", dict.fromkeys(STATES, 0))
            assert rank.model_state_bytes == {k: rank.theory_model_states[k] for k in STATES}
            assert rank.host_model_state_bytes == {k: host[k] for k in STATES}
            assert rank.transfer_bytes_per_step == rank.theory_transfer_bytes_per_step
    rank = off.ranks[0]
    assert rank.model_state_bytes["optimizer"] == 0 and rank.host_model_state_bytes["optimizer"] > 0
    # the table under the picture is the ledgers' numbers
    row = next(r for r in course.offload_rows(panel.last_report) if r["offload"] == "optimizer" and r["rank"] == 0)
    assert row["d2h B/step (measured)"] == row["d2h B/step (theory)"] == rank.transfer_bytes_per_step["d2h"]
    assert row["host B (measured)"] == sum(rank.host_model_state_bytes.values()) == row["host B (theory)"]
    assert f"{row['host B (measured)']:,}" in panel.details.value
    moved = sum(sum(r.transfer_bytes_per_step.values()) for r in off.ranks)
    shard = rank.transfer_bytes_per_step["d2h"] / 2  # bf16: 2 bytes per element of the padded Ψ/N
    assert moved == theory.offload_traffic_bytes(2 * shard, 2)  # 2Ψ out + 2Ψ back over the 2 ranks
    assert f"{moved:,.0f} B/step" in panel.status.value

    first = picture(panel)
    panel.world_size.value = 3  # auto_run: a change reruns
    assert panel.runs == 2 and len(panel.last_report.results[1].ranks) == 3 and picture(panel) != first
    panel.stage.value = "zero3"
    panel.offload.value = "params"
    assert panel.runs == 4 and panel.last_error is None
    params = panel.last_report.results[1].ranks[0]
    assert params.model_state_bytes == dict.fromkeys(STATES, 0)  # nothing rests on the device
    assert params.transfer_bytes_per_step["h2d"] == 2 * params.transfer_bytes_per_step["d2h"]  # a fetch per gather
    assert capsys.readouterr().out == ""


def test_offload_panel_shows_a_refused_combination_and_keeps_the_last_picture(work):
    panel = course.OffloadPanel(work, stage="zero3", offload="params", world_sizes=(2,), steps=1)
    before, runs = picture(panel), panel.runs
    panel.stage.value = "zero1"  # params needs stage 3: refused before any process starts
    assert panel.runs == runs and "needs ZeRO stage 3" in panel.last_error
    assert "needs ZeRO stage 3" in panel.status.value and picture(panel) == before
    panel.offload.value = "none"  # one job: no offload to compare
    assert panel.last_error is None and [r.options["offload"] for r in panel.last_report.results] == ["none"]
    with pytest.raises(ValueError, match="offload='cpu'; allowed: none, optimizer, params"):
        course.OffloadPanel(work, offload="cpu", run=False)


def test_checkpointing_panel_reruns_on_a_change_and_matches_the_formula(capsys):
    panel = course.CheckpointingPanel(blocks=(2, 4), n=4, policy="every_k", k=2, repeats=1)
    r = panel.result
    assert panel.runs == 1 and picture(panel).startswith(PNG) and panel.last_error is None
    assert r["stored"] == r["theory_stored"] == 2 * r["X"]  # ⌈n/k⌉ kept inputs, from the ledger
    assert r["peak"] == r["theory_peak"] - r["X"]  # the recomputed segment's first block saves its kept input
    assert r["recomputed_forwards"] == 4 and r["none_stored"] == r["none_peak"] == 4 * r["A"]
    assert f"{r['peak']:,} B" in panel.status.value

    first = picture(panel)
    panel.k.value = 4  # one segment of all 4 blocks: the peak is back at none's
    assert panel.runs == 2 and picture(panel) != first
    assert panel.result["peak"] == panel.result["none_peak"] and panel.result["stored"] == panel.result["X"]
    panel.policy.value = "torch-every"  # torch hides its tensors from the ledger: live tensors count them
    assert panel.runs == 3 and panel.k.disabled and panel.result["counted_by"] == "live tensors"
    every = course.measure_policy(4, "every", repeats=1)
    assert panel.result["stored"] > 0 and panel.result["theory_peak"] is None and every["theory_peak"] is not None
    panel.policy.value = "every_k"
    panel.blocks.value = 2  # k = 4 is above 2 blocks: shown, not raised
    assert "above the model's 2 blocks" in panel.last_error and "above the model" in panel.status.value
    assert capsys.readouterr().out == ""
