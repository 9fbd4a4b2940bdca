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


def moe():
    """The tiny GPT with experts: it trains on every axis (dp, cp, ep, tp, pp) where the combination is allowed."""
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=4, batch_size=8, n_experts=4, top_k=2)


def _every_drawn_axis_is_the_theory(panel):
    ranks = sorted(panel.last_report.results[0].ranks, key=lambda r: r.rank)
    assert set(panel.bars["traffic"]) == set(panel.bars["theory"])
    for axis, bars in panel.bars["traffic"].items():
        assert bars == [(r.comm_bytes_by_axis.get(axis) or {}).get("ring_cost_bytes") or 0 for r in ranks], axis
        assert bars == [pytest.approx(r.theory_comm_bytes_by_axis.get(axis, 0), abs=0.5) for r in ranks], axis
    for rank, row in zip(ranks, course.grid_rows(panel.last_report)):
        assert row["states B (measured)"] == row["states B (theory)"]
        for axis in panel.bars["traffic"]:
            assert row[f"{axis} B/step (ledger)"] == pytest.approx(row[f"{axis} B/step (theory)"], abs=0.5)
    return ranks


def test_a_cp_grid_draws_cp_and_the_dp_cp_group_next_to_theory():
    panel = course.GridPanel(moe(), dp=1, tp=1, pp=1, stage="ddp", degrees=(1, 2), max_world_size=4, cp=2,
                             cp_attention="ring")
    assert panel.runs == 1 and panel.last_error is None and panel.image.value
    result = panel.last_report.results[0]
    assert result.parallel["cp"] == 2 and len(result.ranks) == 2
    ranks = _every_drawn_axis_is_the_theory(panel)
    # the sequence cut over cp: attention's bytes on cp, the weights' gradients on the flattened dp × cp group
    assert list(panel.bars["traffic"]) == ["dp_cp", "cp", "tp", "pp"]
    assert all(v > 0 for axis in ("dp_cp", "cp") for v in panel.bars["traffic"][axis])
    rows = course.grid_rows(panel.last_report)
    assert [row["cp"] for row in rows] == [0, 1] and "ep" not in rows[0] and "dp B/step (ledger)" not in rows[0]
    ring = panel.bars["traffic"]["cp"]

    panel.attention.value = "ulysses"  # with cp = 2 the attention is used: a rerun, the cp bytes change
    assert panel.runs == 2 and panel.last_error is None and panel.ran_attention == "ulysses"
    _every_drawn_axis_is_the_theory(panel)
    assert panel.bars["traffic"]["cp"] != ring and panel.bars["traffic"]["dp_cp"] == [
        r.comm_bytes_by_axis["dp_cp"]["ring_cost_bytes"] for r in ranks]

    panel.degree["cp"].value = 1  # cp off: one rank, the attention control unused
    assert panel.runs == 3 and panel.attention.disabled and "cp" not in panel.last_report.results[0].parallel
    panel.attention.value = "ring"
    assert panel.runs == 3


@pytest.mark.parametrize("tp", [1, 2])
def test_an_ep_grid_draws_the_all_to_alls_next_to_theory(tp):
    panel = course.GridPanel(moe(), dp=2, tp=tp, pp=1, stage="zero1", degrees=(1, 2), max_world_size=4, ep=2)
    assert panel.runs == 1 and panel.last_error is None and panel.image.value
    result = panel.last_report.results[0]
    assert result.parallel["ep"] == 2 and len(result.ranks) == 2 * tp  # ep is carved from dp: no ranks of its own
    _every_drawn_axis_is_the_theory(panel)
    assert list(panel.bars["traffic"]) == ["dp", "ep", "tp", "pp"]
    assert all(v > 0 for v in panel.bars["traffic"]["ep"] + panel.bars["traffic"]["dp"])
    assert all((v > 0) == (tp > 1) for v in panel.bars["traffic"]["tp"])
    rows = course.grid_rows(panel.last_report)
    assert [(row["dp"], row["ep"], row["tp"]) for row in rows] == [(d, d, t) for d in range(2) for t in range(tp)]


def test_refused_combinations_show_the_librarys_reason_and_run_nothing():
    panel = course.GridPanel(moe(), dp=1, tp=1, pp=2, stage="ddp", degrees=(1, 2), max_world_size=8, run=False)
    panel.degree["cp"].value = 2  # cp with a pipeline: refused before any process starts
    assert panel.runs == 0 and panel.last_report is None
    assert panel.last_error.startswith("ValueError") and "cp=2 with pp=2" in panel.last_error
    assert "cp=2 with pp=2" in panel.status.value
    panel.auto_run = False  # set two controls, then run once: ep with a pipeline, on 4 ranks
    panel.degree["cp"].value = 1
    panel.degree["dp"].value = 2
    panel.degree["ep"].value = 2
    panel.run_button.click()
    assert panel.runs == 0 and panel.last_report is None and "ep=2 with cp=1, pp=2" in panel.last_error
    assert "expert parallelism" in panel.status.value

    dense = course.GridPanel(work(), dp=2, tp=1, pp=1, stage="ddp", degrees=(1, 2), max_world_size=2, ep=2, run=False)
    dense.run_button.click()  # ep on a model without experts: the library's words
    assert dense.runs == 0 and "no mixture-of-experts layer" in dense.last_error


def test_new_arguments_are_validated_by_name():
    with pytest.raises(ValueError, match=r"cp=3 is not among degrees=\(1, 2\)"):
        course.GridPanel(moe(), degrees=(1, 2), cp=3, run=False)
    with pytest.raises(ValueError, match="ep=8"):
        course.GridPanel(moe(), ep=8, run=False)
    with pytest.raises(ValueError, match="cp_attention='flash'; allowed: ring, ulysses"):
        course.GridPanel(moe(), cp=2, cp_attention="flash", run=False)
    panel = course.GridPanel(moe(), dp=2, tp=2, pp=2, degrees=(2, 4), run=False)  # cp and ep offer 1 (off) anyway
    assert panel.degree["cp"].value == panel.degree["ep"].value == 1 and panel.attention.disabled
    assert panel.parallel == {"pp": 2, "dp": 2, "tp": 2}
