"""The course's pipeline panel: each control re-simulates the schedule and redraws its picture."""
import pytest

from zerokit import theory

pytest.importorskip("ipywidgets")
from zerokit.course import PipelinePanel  # noqa: E402


def test_micro_batch_slider_redraws_and_the_bubble_follows_the_formula():
    panel = PipelinePanel(p=4, m=4, name="1f1b")
    first, draws = panel.image.value, panel.draws
    assert first and panel.result.bubble_fraction == pytest.approx(theory.bubble_fraction(4, 4))
    panel.micro_batches.value = 16
    assert panel.draws == draws + 1 and panel.image.value != first
    assert panel.result.bubble_fraction == pytest.approx(theory.bubble_fraction(4, 16))
    panel.schedule.value = "interleaved"
    assert not panel.chunks.disabled
    assert panel.result.bubble_fraction == pytest.approx(theory.bubble_fraction(4, 16, 2))
    panel.schedule.value = "zb-h1"
    assert panel.chunks.disabled
    assert panel.result.bubble_fraction == pytest.approx(theory.zb_h1_bubble_fraction(4, 16))
    assert "PipelinePanel" in repr(panel)



def test_every_size_on_the_sliders_draws():
    panel = PipelinePanel(p=2, m=1, name="gpipe")
    for name in ("gpipe", "1f1b", "interleaved", "zb-h1"):
        panel.schedule.value = name
        for p in (2, 8):  # the smallest and largest on the slider
            panel.stages.value = p
            assert panel.last_error is None and panel.result.ranks == p, (name, p)
