"""The course's panels, driven as a learner would: set a control's value, click Run, read what was drawn.

Every panel runs real jobs (zerokit.train / zerokit.launch on gloo); these tests check
that a change re-runs the right job, that the picture is redrawn, that what the panel
measured equals zerokit.theory, and that a panel prints nothing (text printed inside a
widget callback would leak into a notebook cell's output under nbval).
"""
import math

import pytest

pytest.importorskip("ipywidgets")

import zerokit  # noqa: E402
from zerokit import course, theory  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def picture(panel) -> bytes:
    """The PNG the panel shows (ipywidgets hands it back as a memoryview)."""
    return bytes(panel.image.value)


@pytest.fixture(scope="module")
def work():
    return zerokit.tiny_gpt(vocab=32, seq_len=8, d_model=16, n_layer=1, n_head=2, batch_size=4)


def test_table_shows_html_and_aligned_text():
    t = course.table([{"name": "ddp", "bytes": 1234567, "ratio": 1.5}, {"name": "zero3", "bytes": 7, "ratio": None}],
                     title="t")
    html = t._repr_html_()
    assert "<table>" in html and "<th>bytes</th>" in html and "1,234,567" in html and "—" in html
    lines = repr(t).splitlines()
    assert lines[0] == "t" and lines[1].split() == ["name", "bytes", "ratio"]
    assert len({len(line) for line in lines[1:]}) == 1  # aligned columns


def test_memory_panel_runs_on_click_and_redraws(work, capsys):
    panel = course.MemoryPanel(work, strategies=("ddp", "zero1"), world_sizes=(1, 2), steps=1)
    assert panel.runs == 1 and panel.last_error is None
    report = panel.last_report
    assert [r.strategy for r in report.results] == ["ddp", "zero1"]
    assert all(r.world_size == 2 and r.precision == "fp32" for r in report.results)
    assert picture(panel).startswith(PNG)
    assert panel.progress.value == panel.progress.max == 2

    first_picture = picture(panel)
    panel.precision.value = "bf16-mixed"
    assert panel.runs == 1  # no auto-run: the Run button decides
    panel.run_button.click()
    assert panel.runs == 2
    psi = work.param_count()
    for result in panel.last_report.results:
        assert result.precision == "bf16-mixed"
        for rank in result.ranks:
            assert sum(rank.model_state_bytes.values()) == rank.theory_model_states["total"]
    ddp = panel.last_report["ddp"].ranks[0]
    assert ddp.model_state_bytes["params"] == theory.param_bytes_per_element("bf16-mixed") * psi
    assert picture(panel) != first_picture

    before = picture(panel)
    panel.view.value = "peak"  # redraws the same report, runs nothing
    assert panel.runs == 2 and picture(panel) != before
    assert "theory B" in panel.details.value
    assert capsys.readouterr().out == ""


def test_memory_panel_auto_run_follows_the_world_size(work):
    panel = course.MemoryPanel(work, strategies=("zero2",), world_sizes=(1, 2), world_size=1, steps=1,
                               auto_run=True)
    assert panel.last_report.result.world_size == 1
    panel.world_size.value = 2
    assert panel.runs == 2
    rank = panel.last_report.result.ranks[1]
    assert len(panel.last_report.result.ranks) == 2
    assert sum(rank.model_state_bytes.values()) == rank.theory_model_states["total"]


def test_a_failing_job_is_shown_in_the_panel_not_raised(work):
    panel = course.MemoryPanel(work, strategies=("ddp",), world_sizes=(3,), steps=1)
    assert panel.runs == 0 and panel.last_report is None
    assert "divisible" in panel.last_error and "divisible" in panel.status.value
    assert not panel.run_button.disabled


def test_timeline_panel_reruns_when_the_bucket_slider_moves(work, capsys):
    panel = course.TimelinePanel(work, ["ddp-bucketed", "ddp"], controls={"bucket_mb": [0.001, 0.004, 0.1],
                                                                         "overlap": True}, steps=2)
    assert panel.runs == 1 and panel.strategy.value == "ddp"
    assert panel.options() == {"bucket_mb": 0.004, "overlap": True}
    result = panel.last_report.result
    assert result.options == {"bucket_mb": 0.004, "overlap": True}
    calls = result.ranks[0].comm_calls_per_step
    first = picture(panel)

    panel.controls["bucket_mb"].value = 0.001
    assert panel.runs == 2
    small = panel.last_report.result
    assert small.options["bucket_mb"] == 0.001
    assert small.ranks[0].comm_calls_per_step > calls  # smaller buckets, more calls
    psi = work.param_count()
    assert small.ranks[0].comm_ring_cost_bytes_per_step == theory.comm_bytes_per_step(0, psi, 2, 4)  # same bytes
    assert small.ranks[0].comm_payload_bytes_per_step == 4 * psi  # every fp32 gradient all-reduced once (measured)
    assert small.ranks[0].comm_sent_bytes_per_step is None  # gloo ran it: nothing counted the wire
    assert picture(panel).startswith(PNG) and picture(panel) != first
    assert set(panel.last_exposed_s) == {0, 1} and all(s >= 0 for s in panel.last_exposed_s.values())
    assert "exposed − wait ms/step" in panel.details.value and "straggler wait" in panel.details.value
    assert "ring cost B/step (formula on measured payload)" in panel.details.value

    panel.strategy.value = "ddp-bucketed"  # has no overlap option: its checkbox is disabled
    assert panel.runs == 3 and panel.controls["overlap"].disabled
    assert panel.options() == {"bucket_mb": 0.001}
    assert capsys.readouterr().out == ""


def test_timeline_panel_for_zero3_shows_traffic_and_peak_memory(work):
    panel = course.TimelinePanel(work, "zero3", controls={"prefetch": True, "reshard_after_forward": True},
                                 steps=2, show_memory=True)
    psi = work.param_count()
    rank0 = panel.last_report.result.ranks[0]
    assert rank0.comm_ring_cost_bytes_per_step == rank0.theory_comm_bytes_per_step
    resharded = rank0.comm_ring_cost_bytes_per_step
    panel.controls["reshard_after_forward"].value = False  # gathered once per step, not twice
    kept = panel.last_report.result.ranks[0]
    assert panel.runs == 2
    assert kept.comm_ring_cost_bytes_per_step == kept.theory_comm_bytes_per_step
    assert kept.comm_ring_cost_bytes_per_step / resharded == 2 / 3  # one gather per step instead of two
    assert resharded >= theory.comm_bytes_per_step(3, psi, 2, 4)  # 3(N−1)/N·Ψb, padded units


def test_collective_panel_measures_the_ring(capsys):
    panel = course.CollectivePanel(world_sizes=(2, 3), payload_kib=(1, 4), world_size=2)
    assert panel.runs == 1
    panel.world_size.value = 3
    panel.op.value = "reduce_scatter"
    assert panel.runs == 3
    for rank in panel.last_result:
        assert rank["rounds"] == theory.ring_steps("reduce_scatter", 3)
        # measured on the wire (zerokit's ring ran it) and equal to the ring formula
        assert rank["sent_bytes"] == theory.ring_bytes_sent("reduce_scatter", rank["payload_bytes"], 3)
        assert rank["ring_cost_bytes"] == rank["sent_bytes"]
    assert "sent B (measured, ring)" in panel.details.value
    assert picture(panel).startswith(PNG)
    assert capsys.readouterr().out == ""


def test_panels_have_a_short_text_form_and_a_widget_view(work):
    panel = course.MemoryPanel(work, strategies=("ddp",), world_sizes=(2,), steps=1, run=False)
    assert panel.runs == 0 and picture(panel) == b""
    bundle = panel._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == repr(panel) and "interactive panel" in repr(panel) and len(repr(panel)) < 200


def test_latency_bandwidth_fit_recovers_a_known_model():
    alpha, beta = 50e-6, 1e9
    points = [{"op": "all_reduce", "n": n, "payload_bytes": s,
               "seconds": theory.ring_steps("all_reduce", n) * alpha + theory.ring_bytes_sent("all_reduce", s, n) / beta}
              for n in (2, 4) for s in (100, 10_000, 1_000_000, 100_000_000)]
    fit = course.fit_latency_bandwidth(points)
    assert math.isclose(fit["alpha_s"], alpha, rel_tol=1e-6) and math.isclose(fit["beta_Bps"], beta, rel_tol=1e-6)
    small = course.modelled_seconds(fit, "all_reduce", 100, 4)
    large = course.modelled_seconds(fit, "all_reduce", 100_000_000, 4)
    assert small["latency_share"] > 0.99 and large["latency_share"] < 0.01


def test_ring_schedule_figure_draws_every_round():
    fig = course.ring_schedule_figure(3, "all_reduce")
    ax = fig.axes[0]
    assert len(ax.patches) == 3 * theory.ring_steps("all_reduce", 3)
    assert "4 rounds" in ax.get_title()
    assert course.png(fig).startswith(PNG)


def test_volume_figure_labels_what_its_points_are():
    fig = course.volume_figure({"ddp": {"N": [2, 4], "ring_cost": [1.0, 1.5], "theory": [1.0, 1.5]},
                                "ring": {"N": [2, 4], "sent": [1.0, 1.5], "theory": [1.0, 1.5]}})
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "ddp: ring cost (formula on measured payload)" in labels and "ring: sent (measured, ring)" in labels
    assert not any(label.endswith(": measured") for label in labels)
    with pytest.raises(ValueError, match="exactly one"):
        course.volume_figure({"ddp": {"N": [2], "theory": [1.0]}})


def test_machine_summary_names_a_backend_per_world_size():
    text = course.machine_summary((1, 2))
    assert "world_size=1" in text and "world_size=2" in text
    assert "gloo" in text or "NCCL" in text
