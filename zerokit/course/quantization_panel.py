"""ZeRO++'s block quantizer on real weights: block size × bits → the error each element kept and the bytes sent.

:class:`QuantizationPanel` runs no job: every change of a control quantizes one flat tensor
(a model's parameters, as a rank's shard would hold them) with :mod:`zerokit.zero.quantize`
and draws, measured next to :mod:`zerokit.theory.zeropp`:

- left, how much of its bound each element used: |x − x̂| over its own block's scale/2, as a
  histogram (never above 1: :func:`~zerokit.theory.zeropp.block_quantization_error_bound`);
- right, the bytes that would be sent: fp32 and bf16 (4 and 2 bytes per element), and the
  codes plus the float32 scales measured on the tensors the codec returned, next to
  :func:`~zerokit.theory.zeropp.quantized_bytes` (a line on the bar).

:func:`quantization_rows` is the table under the picture, one row per block size and bits, and
:meth:`QuantizationPanel.table` that table as it stands, for a notebook read without a kernel.
:func:`loss_effect_figure` draws what quantization cost a training run
(:func:`zerokit.zero.zeropp_error.zeropp_loss_effect`): the two loss curves, and the weights'
and the gradients' round-trip errors each on an axis of its own, next to their bound.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..theory import zeropp
from ..zero.quantize import dequantize_blocks, quantize_blocks
from .figures import legend_outside, new_figure, png
from .panel import ipywidgets, mimebundle
from .tables import table

BLOCK_SIZES = (16, 64, 256, 1024, 4096)


def measure_quantization(values: torch.Tensor, block_size: int, bits: int = 8) -> dict:
    """Quantize ``values`` (flat) and measure: the bytes of the codes and the scales, each element's error and its
    own block's bound scale/2, next to the formulas."""
    flat = values.detach().reshape(-1).to(torch.float32)
    q, scales = quantize_blocks(flat, block_size, bits)
    back = dequantize_blocks(q, scales, block_size, flat.numel(), bits)
    error = (flat - back).abs()
    padded = torch.cat([flat, flat.new_zeros((-flat.numel()) % block_size)])
    absmax = padded.view(-1, block_size).abs().amax(dim=1)  # an all-zero block comes back exact: no bound to use
    bound = torch.where(absmax > 0, scales / 2, torch.zeros_like(scales)).repeat_interleave(block_size)[:flat.numel()]
    used = torch.where(bound > 0, error / bound, torch.zeros_like(error))
    return {"block_size": block_size, "bits": bits, "numel": flat.numel(),
            "measured_bytes": q.numel() * q.element_size() + scales.numel() * scales.element_size(),
            "formula_bytes": zeropp.quantized_bytes(flat.numel(), block_size, bits),
            "max_error": float(error.max()), "mean_error": float(error.mean()), "max_bound": float(bound.max()),
            "max_share_of_bound": float(used.max()), "share_of_bound": used,
            "relative_bound": zeropp.block_quantization_relative_bound(bits)}


def quantization_rows(measurements: Sequence[dict]) -> list:
    """One row per measurement: bytes measured and formula, against bf16, and the error against its bound."""
    return [{"block size · bits": f"{m['block_size']} · int{m['bits']}",
             "bytes (measured)": m["measured_bytes"], "bytes (theory.zeropp)": m["formula_bytes"],
             "÷ bf16's 2 B/element": f"{m['measured_bytes'] / (2 * m['numel']):.3f}",
             "max |x − x̂| / its scale/2 (measured)": f"{m['max_share_of_bound']:.3f}"} for m in measurements]


def quantization_figure(m: dict):
    """The histogram of |x − x̂| / (scale/2) per element, and the bytes: fp32, bf16, codes + scales."""
    fig, (left, right) = new_figure(10, 3.6, ncols=2, width_ratios=[3, 2])
    left.hist(m["share_of_bound"].numpy(), bins=40, range=(0, 1), color="#4C72B0", label="elements (measured)")
    left.axvline(1.0, color="#C44E52", lw=1.5, label="the bound: its block's scale/2")
    left.set_xlim(-0.02, 1.05)
    left.set_xticks([0, 0.25, 0.5, 0.75, 1.0], ["0", "¼", "½", "¾", "1"])
    left.set_xlabel("|x − x̂| / (its block's scale/2)")
    left.set_ylabel("elements")
    left.set_title(f"{m['numel']:,} weights, blocks of {m['block_size']}, int{m['bits']}:\n"
                   f"largest {m['max_share_of_bound']:.2f} of its bound", fontsize=10)
    legend_outside(left, "below", ncol=2, bbox_to_anchor=(0.5, -0.3))
    names = ["fp32", "bf16", f"int{m['bits']} + scales"]
    values = [4 * m["numel"], 2 * m["numel"], m["measured_bytes"]]
    colors = ["#999999", "#8172B2", "#55A868"]
    for x, (name, value, color) in enumerate(zip(names, values, colors)):
        right.bar(x, value / 1024, 0.6, color=color,
                  label=f"{name}: {value // m['numel']} B/element (computed)" if x < 2 else f"{name} (measured)")
    right.plot([1.7, 2.3], [m["formula_bytes"] / 1024] * 2, color="black", lw=2, label="theory.zeropp.quantized_bytes")
    right.set_xticks(range(3), names)
    right.set_ylabel("KiB per copy of the tensor")
    right.set_title("bytes on the wire", fontsize=10)
    legend_outside(right, "right")
    fig.tight_layout()
    return fig


def loss_effect_figure(effect: dict, title: str):
    """ZeRO-3's and ZeRO++'s loss per step (left, titled ``title``), then the weights' (middle) and the gradient
    pieces' (right) round-trip error per step, each on its own scale — the gradients' errors are several times the
    weights', and on one axis the weights' would be a flat line at its foot. Each error panel draws the largest
    element's error and the mean over every element, both measured, and the bound, the largest block's scale/2, as
    a dashed line over them: where the largest error reaches its bound, the solid line shows between the dashes."""
    fig, (loss, weights, grads) = new_figure(15, 4.0, ncols=3, width_ratios=[4, 3, 3])
    steps = effect["steps"]
    loss.plot(steps, effect["losses"]["zero3"], color="#4C72B0", lw=1.5, label="ZeRO-3 (exact)")
    loss.plot(steps, effect["losses"]["zeropp"], color="#DD8452", lw=1.2, ls="--", label="ZeRO++")
    loss.set_ylabel("training loss (measured)")
    loss.set_title(title, fontsize=10)
    for ax, tallies, color, what in ((weights, effect["weight_error"], "#55A868", "weights"),
                                     (grads, effect["gradient_error"], "#C44E52", "gradient pieces")):
        ax.plot(steps, [t["max_abs"] for t in tallies], color=color, lw=2.0, label="largest |x − x̂|")
        ax.plot(steps, [t["mean_abs"] for t in tallies], color=color, lw=1.0, alpha=0.6, label="mean |x − x̂|")
        ax.plot(steps, [t["max_bound"] for t in tallies], color="black", lw=1.0, ls=(0, (4, 3)),
                label="bound: scale/2")
        ax.set_ylim(0, 1.08 * max(t["max_bound"] for t in tallies))
        ax.set_ylabel("round-trip error (measured)")
        ax.set_title(f"{what}: error per step, its own scale", fontsize=10)
    for ax in (loss, weights, grads):
        ax.set_xlabel("step")
        legend_outside(ax, "below", ncol=2, bbox_to_anchor=(0.5, -0.22))
    fig.tight_layout()
    return fig


class QuantizationPanel:
    """Block size and bits → the measured error of each element against its bound, and the bytes against bf16."""

    def __init__(self, values: torch.Tensor, block_sizes: Sequence[int] = BLOCK_SIZES, block_size: int = 256,
                 bits: int = 8):
        w = ipywidgets()
        self.values = values.detach().reshape(-1).to(torch.float32).clone()
        self.block_size = w.SelectionSlider(options=list(block_sizes), value=block_size, description="block size",
                                            continuous_update=False)
        self.bits = w.ToggleButtons(options=[("int8", 8), ("int4", 4)], value=bits, description="bits")
        self.image = w.Image(format="png")
        self.details = w.HTML(value="")
        self.last = None
        #: the rows of the table under the picture (:func:`quantization_rows`), one per block size
        self.rows: list = []
        #: how many times the panel has drawn (a test reads it)
        self.runs = 0
        for control in (self.block_size, self.bits):
            control.observe(lambda change: self.run(), names="value")
        self.box = w.VBox([w.HBox([self.block_size, self.bits]), self.image, self.details])
        self.run()

    def run(self) -> dict:
        self.last = measure_quantization(self.values, self.block_size.value, self.bits.value)
        self.image.value = png(quantization_figure(self.last))
        others = [measure_quantization(self.values, b, self.bits.value) for b in self.block_size.options]
        self.rows = quantization_rows(others)
        self.details.value = table(self.rows)._repr_html_()
        self.runs += 1
        return self.last

    def table(self):
        """The table under the picture as it stands (every block size at the chosen bits): a cell that shows it
        keeps it in the saved notebook, where the widget's copy is not."""
        return table(self.rows, title=f"every block size at int{self.bits.value}, measured on "
                                      f"{self.values.numel():,} values")

    def __repr__(self) -> str:
        return (f"QuantizationPanel over {self.values.numel():,} values: an interactive panel — run this notebook in "
                f"Jupyter to use it")

    def _repr_mimebundle_(self, **kwargs):
        return mimebundle(self, **kwargs)
