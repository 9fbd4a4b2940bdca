"""The course's grid panel: real jobs on a dp × tp × pp mesh, a control change reruns, the bars are the ledgers'."""
import pytest

pytest.importorskip("ipywidgets")
import zerokit  # noqa: E402
from zerokit import course  # noqa: E402


def work():
    return zerokit.tiny_gpt(vocab=16, seq_len=4, d_model=8, n_layer=2, n_head=2, batch_size=4)


def test_a_control_change_reruns_and_the_bars_are_the_ledgers():
    panel = course.GridPanel(work(), dp=1, tp=1, pp=2, stage="ddp", degrees=(1, 2), max_world_size=2)
    assert panel.runs == 1 and panel.last_error is None and panel.image.value
    result = panel.last_report.results[0]
    assert result.parallel == {"pp": 2, "dp": 1, "tp": 1} and result.strategy == "ddp"
    ranks = sorted(result.ranks, key=lambda r: r.rank)
    assert panel.bars["states"] == [sum(r.model_state_bytes.values()) for r in ranks]
    assert panel.bars["traffic"]["pp"] == [r.comm_bytes_by_axis["pp"]["ring_cost_bytes"] for r in ranks]
    assert all(v > 0 for v in panel.bars["traffic"]["pp"]) and panel.bars["traffic"]["tp"] == [0, 0]
    first = panel.image.value

    panel.degree["pp"].value = 1  # 1 rank on every axis but dp... dp is still 1: rerun with a single rank
    panel.degree["dp"].value = 2  # now 2 ranks on dp: the traffic moves from pp to dp
    assert panel.runs == 3 and panel.last_error is None and panel.image.value != first
    result = panel.last_report.results[0]
    assert result.parallel == {"pp": 1, "dp": 2, "tp": 1}
    ranks = sorted(result.ranks, key=lambda r: r.rank)
    assert panel.bars["traffic"]["dp"] == [r.comm_bytes_by_axis["dp"]["ring_cost_bytes"] for r in ranks]
    for rank, row in zip(ranks, course.grid_rows(panel.last_report)):
        assert row["dp B/step (ledger)"] == row["dp B/step (theory)"] > 0
        assert row["states B (measured)"] == row["states B (theory)"] == rank.theory_model_states["total"]

    panel.stage.value = "zero1"  # the stage on dp: the optimizer states halve
    assert panel.runs == 4 and panel.last_report.results[0].strategy == "zero1"
    ddp_optimizer = ranks[0].model_state_bytes["optimizer"]
    assert panel.last_report.results[0].ranks[0].model_state_bytes["optimizer"] < ddp_optimizer


def test_refusals_are_shown_not_raised():
    panel = course.GridPanel(work(), dp=1, tp=1, pp=2, stage="ddp", degrees=(1, 2), max_world_size=2, run=False)
    panel.stage.value = "zero3"  # ZeRO-3 with a pipeline: refused before any process starts
    assert panel.runs == 0 and "pipeline" in panel.last_error
    panel.degree["dp"].value = 2  # 4 ranks, above the panel's limit: nothing runs
    assert panel.runs == 0 and "at most 2" in panel.last_error
    with pytest.raises(ValueError, match="stage"):
        course.GridPanel(work(), stage="zero4", run=False)
    assert "GridPanel" in repr(panel)
