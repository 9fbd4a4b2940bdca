"""Timelines: per-rank compute spans and collectives on one axis, exposed communication, the Gantt chart."""
import io
import pickle

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import zerokit  # noqa: E402
from zerokit import plot, timeline  # noqa: E402
from zerokit.runtime.timeline import Tracer  # noqa: E402


def small_gpt():
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=12)


def test_tracer_records_loop_spans_and_every_leaf_module_in_process():
    work = small_gpt()
    model = work.build_model()
    tracer = Tracer(rank=0)
    tracer.instrument(model)
    x, y = work.batch(0)
    with tracer.span("forward"):
        loss = work.loss(model(x), y)
    with tracer.span("backward"):
        loss.backward()
    tracer.remove_hooks()
    model(x)  # no longer traced
    events = pickle.loads(pickle.dumps(tracer.events()))
    assert events[0]["kind"] == "clock" and "wall" in events[0]
    leaves = {n for n, m in model.named_modules() if next(m.children(), None) is None}
    for kind in ("forward", "backward"):
        assert {e["name"] for e in events if e["kind"] == kind} == leaves
        assert sum(e["kind"] == kind for e in events) == len(leaves)
    spans = [e for e in events if e["kind"] == "span"]
    assert [s["name"] for s in spans] == ["forward", "backward"]
    assert all(e["start"] <= e["end"] for e in events)
    backward = spans[1]
    assert all(backward["start"] <= e["start"] <= e["end"] <= backward["end"]
               for e in events if e["kind"] == "backward")


@pytest.mark.parametrize("n", [2, 4])
def test_timeline_renders_and_exposed_time_is_the_ledgers_blocked_time(n):
    work = small_gpt()
    report = zerokit.train(work, "ddp", world_size=n, steps=3, keep_records=True, bucket_mb=0.02, reference=False)
    ax, exposed = plot.timeline(report, steps=range(1, 3), modules=True)
    assert sorted(exposed) == list(range(n))
    for rank in report.result.ranks:
        in_steps = [r for r in rank.comm_records if r["phase"] != "setup" and r["step"] in (1, 2)]
        assert exposed[rank.rank] == pytest.approx(sum(r["blocked_s"] for r in in_steps))
        assert timeline.exposed_comm_s(rank) >= exposed[rank.rank] >= 0
        line = timeline.rank_timeline(rank)
        loop = [c for c in line["compute"] if c["name"] != "grad sync"]
        assert [c["name"] for c in loop] == ["forward", "backward", "step"] * 3
        assert [c["step"] for c in loop] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
        for c in filter(lambda c: c["name"] == "backward", loop):  # ends with the last module's backward
            assert c["end"] == max(m["end"] for m in line["modules"] if m["kind"] == "backward"
                                   and c["start"] <= m["start"] <= c["end"])
        for c in line["comm"]:
            assert c["start"] <= c["blocked_start"] + 1e-9 and c["blocked_start"] <= c["end"]
    assert len(ax.get_yticks()) == n
    ax.figure.savefig(io.BytesIO(), format="png")
    # the setup checksum is drawn nowhere and counted nowhere
    rank0 = report.result.ranks[0]
    assert any(r["phase"] == "setup" for r in rank0.comm_records)
    assert timeline.exposed_comm_s(rank0) == pytest.approx(
        sum(r["blocked_s"] for r in rank0.comm_records if r["phase"] != "setup"))


def test_overlap_launches_during_backward_and_naive_blocks_for_all_of_its_communication():
    work = small_gpt()
    runs = {
        "on": zerokit.train(work, "ddp", world_size=2, steps=2, keep_records=True, bucket_mb=0.02, reference=False),
        "off": zerokit.train(work, "ddp", world_size=2, steps=2, keep_records=True, bucket_mb=0.02, overlap=False,
                             reference=False),
        "naive": zerokit.train(work, "ddp-naive", world_size=2, steps=2, keep_records=True, reference=False),
    }
    for label, report in runs.items():
        for rank in report.result.ranks:
            line = timeline.rank_timeline(rank)
            # the backward of the first module (the token embedding) is the last one to run
            last_module = max(m["start"] for m in line["modules"] if m["kind"] == "backward" and m["name"] == "tok"
                              and m["step"] == 1)
            launches = [c["start"] for c in line["comm"] if c["step"] == 1 and c["phase"] == "backward"]
            assert launches
            if label == "on":  # the last layers' buckets leave before backward reaches the embeddings
                assert min(launches) < last_module
            else:
                assert min(launches) > last_module
            if label == "naive":  # synchronous: blocked for every collective's whole duration
                assert timeline.exposed_comm_s(rank) == pytest.approx(timeline.comm_in_flight_s(rank))


def test_timeline_needs_records():
    report = zerokit.train(small_gpt(), "ddp", world_size=2, steps=1, reference=False)
    with pytest.raises(ValueError, match="keep_records=True"):
        plot.timeline(report)
    with pytest.raises(ValueError, match="keep_records=True"):
        timeline.exposed_comm_s(report.result.ranks[0])


def test_backward_span_stops_where_backward_compute_stops_and_straggler_waits_name_the_peer():
    """After-backward all-reduces are "grad sync", not backward; a rank waiting for a late peer is told so."""
    report = zerokit.train(small_gpt(), "ddp-bucketed", world_size=2, steps=2, keep_records=True, bucket_mb=0.02,
                           reference=False)
    lines = [timeline.rank_timeline(rank) for rank in report.result.ranks]
    for line in lines:
        for step in (0, 1):
            names = [c["name"] for c in line["compute"] if c["step"] == step]
            assert names == ["forward", "backward", "grad sync", "step"]
            backward, sync = (c for c in line["compute"]
                              if c["step"] == step and c["name"] in ("backward", "grad sync"))
            launches = [c["start"] for c in line["comm"] if c["step"] == step and c["phase"] == "backward"]
            assert backward["end"] <= min(launches) and sync["start"] == backward["end"]
    waits = timeline.straggler_waits(lines)
    for w in waits:
        assert w["peer"] != w["rank"] and w["start"] < w["end"]
        mine = [c for c in lines[w["rank"]]["comm"] if c["step"] == w["step"] and c["op"] == w["op"]]
        assert any(c["blocked_start"] <= w["start"] and w["end"] <= c["end"] for c in mine)
    # rank 0 launches late on purpose in a hand-made pair of lines: rank 1's wait is attributed to it
    fake = [{"rank": r, "comm": [{"phase": "backward", "step": 0, "op": "all_reduce", "start": start,
                                  "blocked_start": start, "blocked_s": 1.0 - start, "end": 1.0}]}
            for r, start in ((0, 0.8), (1, 0.1))]
    assert timeline.straggler_waits(fake) == [{"rank": 1, "step": 0, "op": "all_reduce", "peer": 0,
                                               "start": 0.1, "end": 0.8}]


def test_timeline_panel_link_dropdown_reruns_behind_the_link():
    from zerokit import course

    panel = course.TimelinePanel(small_gpt(), "ddp", controls={"bucket_mb": [0.02]}, steps=2)
    assert panel.link.value == "this machine" and "1gbe" in panel.link.options
    assert all(r["link"] == "" for r in panel.last_report.result.ranks[0].comm_records)
    panel.link.value = "1gbe"
    assert panel.runs == 2 and panel.last_error is None
    train = [r for r in panel.last_report.result.ranks[0].comm_records if r["phase"] != "setup"]
    assert train and all(r["link"] == "1gbe" and r["emulated_s"] > 0 for r in train)
    assert "emulated held ms/step" in panel.details.value and "straggler wait ms/step" in panel.details.value
    assert panel.last_report.result.options == {"bucket_mb": 0.02}
    assert "exposed − wait ms/step" in panel.details.value


def test_exposed_splits_into_straggler_wait_and_the_rest_and_the_figure_can_draw_the_calmest_step():
    """exposed = (exposed − wait) + straggler wait, medians of the ledger's blocked time; the step drawn is named."""
    from zerokit import course
    from zerokit.course.timeline_figure import calmest_step, step_time, timeline_figure

    report = zerokit.train(small_gpt(), "ddp-bucketed", world_size=2, steps=4, keep_records=True, bucket_mb=0.02,
                           reference=False)
    steps = range(1, 4)
    for rank, row in zip(report.result.ranks, course.timeline_stats(report, steps)):
        assert row["exposed − wait ms"] >= 0
        assert row["exposed − wait ms"] + row["straggler wait ms"] == pytest.approx(row["exposed ms"])
        blocked = sorted(1e3 * timeline.exposed_comm_s(rank, range(k, k + 1)) for k in steps)
        assert row["exposed ms"] == pytest.approx(blocked[1])  # the median step's blocked time, from the ledger
    waits = timeline.straggler_waits([timeline.rank_timeline(r) for r in report.result.ranks])
    waited = {k: sum(w["end"] - w["start"] for w in waits if w["step"] == k) for k in steps}
    k = calmest_step(report, steps)
    assert waited[k] == min(waited.values())
    fig = timeline_figure({"bucketed": report}, steps=steps, calmest=True)
    assert fig.axes[0].get_title(loc="left").startswith(f"bucketed, step {k} (least straggler wait of 1–3)")
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(label.startswith("straggler wait") for label in labels)
    assert not any("emulated" in label for label in labels)  # no link in this run: no key for its colour
    fig.savefig(io.BytesIO(), format="png")
    median, spread = step_time(report)
    assert median == pytest.approx(report.result.step_time_s_median) and spread >= 0
