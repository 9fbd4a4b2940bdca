"""The course's quantization panel (lesson 17): a control change redraws, its bytes are the codec's tensors' and the
formula's, every element stays within its block's bound, and its picture passes the figure checks."""
import pytest
import torch

pytest.importorskip("ipywidgets")
from zerokit import course, theory  # noqa: E402
from zerokit.course import quantization_panel  # noqa: E402

from test_course_figures import problems  # noqa: E402


def values():
    """Weights of mixed magnitudes with an all-zero stretch (a zero block at every block size up to 64)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1000, generator=g) * torch.logspace(-3, 1, 1000)
    x[128:192] = 0
    return x


def test_a_control_change_redraws_and_the_numbers_are_the_codecs():
    panel = course.QuantizationPanel(values(), block_size=256, bits=8)
    assert panel.runs == 1 and panel.image.value
    first = panel.image.value
    m = panel.last
    assert m["measured_bytes"] == m["formula_bytes"] == theory.quantized_bytes(1000, 256, 8)
    assert m["max_share_of_bound"] <= 1 + 1e-5 and m["max_error"] <= m["max_bound"] * (1 + 1e-5)
    panel.bits.value = 4
    assert panel.runs == 2 and panel.image.value != first
    int4 = panel.last
    assert int4["measured_bytes"] == theory.quantized_bytes(1000, 256, 4) < m["measured_bytes"]
    assert int4["mean_error"] > m["mean_error"]  # int4's step is 127/7 of int8's
    panel.block_size.value = 16
    assert panel.runs == 3 and panel.last["max_share_of_bound"] <= 1 + 1e-5
    assert panel.last["mean_error"] < int4["mean_error"]  # smaller blocks: each scale fits its weights closer
    assert "image/png" in panel._repr_mimebundle_()


def test_a_zero_block_uses_no_bound_and_the_picture_is_readable():
    m = quantization_panel.measure_quantization(values(), 64, 8)
    assert float(m["share_of_bound"][128:192].abs().max()) == 0  # an all-zero block comes back exact
    for bits in (8, 4):
        fig = quantization_panel.quantization_figure(quantization_panel.measure_quantization(values(), 16, bits))
        assert problems(fig) == []
