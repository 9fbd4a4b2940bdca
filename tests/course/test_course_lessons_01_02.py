"""What lessons 01 and 02 added to the library: ring vs tree all-reduce time, the saved-tensor recorder, and the
static picture every panel leaves in a saved notebook."""
from __future__ import annotations

import base64
import math

import pytest

import zerokit
from zerokit import course, theory
from zerokit.course.saved_tensors import bytes_by_module, saved_tensors
from zerokit.theory.communication import all_reduce_rounds, all_reduce_seconds


def test_ring_latency_grows_with_n_and_tree_latency_with_log_n():
    alpha, beta = 1e-5, 1e10
    for n in (2, 3, 4, 5, 8, 9, 1024):
        ring = all_reduce_seconds(1000, n, alpha, beta, "ring")
        tree = all_reduce_seconds(1000, n, alpha, beta, "tree")
        assert ring["latency_s"] == pytest.approx(2 * (n - 1) * alpha)
        assert tree["latency_s"] == pytest.approx(2 * math.ceil(math.log2(n)) * alpha)
        assert ring["bandwidth_s"] == pytest.approx(theory.ring_bytes_sent("all_reduce", 1000, n) / beta)
        assert tree["bandwidth_s"] == pytest.approx(2 * 1000 / beta)
    assert all_reduce_rounds(1, "tree") == 0 and all_reduce_seconds(10, 1, alpha, beta)["total_s"] == 0


def test_the_crossover_is_where_the_docstring_says():
    alpha, beta, n = 1e-5, 1e10, 64
    crossover = n * beta * alpha * (n - 1 - math.ceil(math.log2(n)))
    below, above = 0.9 * crossover, 1.1 * crossover
    assert all_reduce_seconds(below, n, alpha, beta, "tree")["total_s"] < all_reduce_seconds(below, n, alpha, beta)["total_s"]
    assert all_reduce_seconds(above, n, alpha, beta, "tree")["total_s"] > all_reduce_seconds(above, n, alpha, beta)["total_s"]


@pytest.mark.parametrize("kwargs, word", [({"algorithm": "star"}, "algorithm"), ({"beta": 0}, "beta"),
                                          ({"alpha": -1.0}, "alpha")])
def test_all_reduce_seconds_refuses_bad_input(kwargs, word):
    args = {"payload_bytes": 10, "n": 4, "alpha": 1e-5, "beta": 1e9, **kwargs}
    with pytest.raises(ValueError, match=word):
        all_reduce_seconds(**args)


def test_scaling_figure_refuses_a_link_without_alpha_and_beta():
    with pytest.raises(ValueError, match="alpha_s"):
        course.latency_bandwidth.all_reduce_scaling_figure({"alpha": 1e-6}, [1024], [2, 4])
    fig = course.latency_bandwidth.all_reduce_scaling_figure({"alpha_s": 1e-6, "beta_Bps": 1e10}, [1024], [2, 4])
    assert len(fig.axes[0].lines) == 2  # ring and tree


def test_saved_tensors_fused_layer_is_the_formula_and_math_adds_the_s_squared_term():
    h, a, b = 32, 2, 4
    per_token = {}
    for s in (16, 32):
        work = zerokit.tiny_gpt(vocab=64, seq_len=s, d_model=h, n_layer=1, n_head=a, batch_size=b)
        fused = sum(bytes_by_module(saved_tensors(work), "blocks.0.").values())
        math_path = sum(bytes_by_module(saved_tensors(work, attention="math"), "blocks.0.").values())
        formula = theory.transformer_layer_activation_bytes(s, b, h, a, dropout=False, fused_attention=True)
        assert abs(fused / formula - 1) < 0.01  # the LayerNorms' mean and rstd are the rest
        per_token[s] = (math_path - fused) / (s * b)
    assert per_token[32] - per_token[16] == 4 * a * (32 - 16)  # fp32 probabilities, a heads × s per token


def test_saved_tensors_leaves_parameters_out_and_names_the_loss():
    work = zerokit.tiny_gpt(vocab=64, seq_len=8, d_model=16, n_layer=1, n_head=2, batch_size=2)
    records = saved_tensors(work, precision="fp32")
    # the first MLP linear saves its input (b·s·h fp32), not its 16 × 64 weight: parameters are counted as parameters
    assert bytes_by_module(records, "blocks.0.mlp.fc") == {"blocks.0.mlp.fc": 2 * 8 * 16 * 4}
    assert any(r["module"] == "loss" and r["dtype"] == "float32" for r in records)  # what cross-entropy keeps


@pytest.mark.parametrize("kwargs, word", [({"attention": "flash"}, "attention"), ({"precision": "fp8"}, "precision")])
def test_saved_tensors_refuses_bad_input(kwargs, word):
    work = zerokit.tiny_gpt(vocab=64, seq_len=8, d_model=16, n_layer=1, n_head=2, batch_size=2)
    with pytest.raises(ValueError, match=word):
        saved_tensors(work, **kwargs)


def test_a_panel_offers_a_png_of_its_last_picture_next_to_the_widget():
    pytest.importorskip("ipywidgets")
    panel = course.PipelinePanel(p=2, m=2)
    bundle = panel._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "text/plain" in bundle
    first = base64.b64decode(bundle["image/png"])
    assert first.startswith(b"\x89PNG") and first == bytes(panel.image.value)
    panel.micro_batches.value = 8  # redrawn: the static picture follows
    assert base64.b64decode(panel._repr_mimebundle_()["image/png"]) != first
