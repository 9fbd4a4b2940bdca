"""Activation checkpointing: policy × segment length k × blocks → activation bytes and recompute time, measured.

:class:`CheckpointingPanel` runs in this process, no ranks: every change of a control
measures the chosen policy and ``none`` on the same tiny GPT with dropout
(:func:`zerokit.activation_checkpointing.measure.block_activations`: the blocks' saved tensors in the
memory ledger, after forward and at the peak of backward; torch's own policies, which the
ledger cannot see into, by live tensors) and times forward + backward of the whole model
(:func:`zerokit.activation_checkpointing.measure.step_time`, medians), then draws:

- left, bytes kept for backward, ``none`` against the policy — stored after forward and
  the peak during backward — with :func:`zerokit.theory.checkpointed_activation_bytes`
  applied to the measured block size A and boundary X as ticks (Chen et al.: ⌈n/k⌉·X
  stored, + one segment's k·A while it is recomputed);
- right, the step time of each (medians, measured) and the recomputed forwards counted.

Timing on a shared CPU is noisy (the status line says so); the bytes are exact.
"""
from __future__ import annotations

import html
import math
from typing import Optional, Sequence

from .. import theory
from ..activation_checkpointing.measure import block_activations, step_time
from ..activation_checkpointing.policies import segment_layers, SEGMENTED, THEORY_NAME
from ..workloads import TinyGPT
from .figures import legend_outside, new_figure, png
from .panel import ipywidgets, mimebundle

#: zerokit's policies and torch's, as ``zerokit.train(checkpointing=…)`` takes them
POLICIES = ("every", "every_k", "sqrt", "selective", "torch-every", "torch-selective")
#: policies whose kept tensors only live-tensor counting sees (torch hides them from saved-tensor hooks)
LIVE_ONLY = ("torch-every", "torch-selective")


def measure_policy(n: int, policy: str, k: Optional[int] = None, seq_len: int = 16, d_model: int = 64,
                   n_head: int = 8, batch: int = 2, dropout: float = 0.1, repeats: int = 3, seed: int = 0) -> dict:
    """``none`` and ``policy`` on an n-block tiny GPT: bytes (ledger or live tensors) and step time, measured,
    with the checkpointing formula on the measured A and X."""
    import torch

    torch.manual_seed(seed)
    vocab = 64
    model = TinyGPT(vocab, seq_len, d_model, n, n_head, dropout=dropout)
    x = torch.randn(batch, seq_len, d_model)
    tokens = torch.randint(0, vocab, (batch, seq_len))
    every = k if policy == "every_k" else None
    live = policy in LIVE_ONLY
    stored, peak = ("live_stored", "live_peak") if live else ("stored", "peak")
    none = block_activations(model, x, "none", live=live)
    got = block_activations(model, x, policy, every, live=live)
    boundary = x.numel() * x.element_size()  # X: one block's input, what a checkpoint keeps (measured off the tensor)
    layer = none["stored"] / n  # A: one block's activations, measured by the ledger
    out = {"policy": policy, "n": n, "k": every, "counted_by": "live tensors" if live else "ledger",
           "none_stored": none[stored], "none_peak": none[peak], "stored": got[stored], "peak": got[peak],
           "recomputed_forwards": got["recomputed_forwards"], "A": layer, "X": boundary,
           "korthikanti_A": theory.transformer_layer_activation_bytes(seq_len, batch, d_model, n_head, element_bytes=4,
                                                                       dropout=dropout > 0, fused_attention=True),
           "theory_stored": None, "theory_peak": None, "segment_layers": None}
    if policy in SEGMENTED:
        name = THEORY_NAME[policy]
        seg = segment_layers(policy, n, every)
        out["segment_layers"] = seg
        out["theory_stored"] = theory.checkpointed_activation_bytes(n, 0, boundary, name, segment_layers=every)
        out["theory_peak"] = theory.checkpointed_activation_bytes(n, layer, boundary, name, segment_layers=every)
    out["none_s"] = step_time(model, tokens, "none", repeats=repeats)
    out["policy_s"] = step_time(model, tokens, policy, every, repeats=repeats)
    return out


class CheckpointingPanel:
    """Policy, k and the number of blocks → activation bytes and step time bars, measured next to the formula."""

    def __init__(self, blocks: Sequence[int] = (4, 8, 16), n: int = 8, policies: Sequence[str] = POLICIES,
                 policy: str = "every", k: int = 2, repeats: int = 3, **model):
        if policy not in policies:
            raise ValueError(f"policy={policy!r}; allowed: {', '.join(policies)}")
        w = ipywidgets()
        self.repeats, self.model = repeats, model
        self.policy = w.ToggleButtons(options=list(policies), value=policy, description="policy")
        self.blocks = w.SelectionSlider(options=list(blocks), value=n, description="blocks n", continuous_update=False)
        self.k = w.IntSlider(value=k, min=1, max=max(blocks), description="k (every_k)", continuous_update=False)
        self.status = w.HTML(value="")
        self.image = w.Image(format="png")
        self.result: Optional[dict] = None
        self.last_error: Optional[str] = None
        #: how many times the panel has measured and drawn (a test reads it)
        self.runs = 0
        for control in (self.policy, self.blocks, self.k):
            control.observe(lambda _: self.update(), names="value")
        self.box = w.VBox([w.HBox([w.VBox([self.blocks, self.k]), self.policy]), self.status, self.image])
        self.update()

    def update(self) -> None:
        """Measure the chosen policy and ``none``, then redraw."""
        policy, n = self.policy.value, self.blocks.value
        self.k.disabled = policy != "every_k"
        try:
            self.result = measure_policy(n, policy, self.k.value if policy == "every_k" else None,
                                         repeats=self.repeats, **self.model)
        except ValueError as exc:  # shown, not raised from a callback nobody sees (k above n, say)
            self.result, self.last_error = None, str(exc)
            self.status.value = f"<span style='color:#C44E52'>{html.escape(self.last_error)}</span>"
            return
        self.last_error = None
        self.runs += 1
        self.draw()

    def draw(self) -> None:
        r = self.result
        fig, (left, right) = new_figure(11.0, 4.4, ncols=2, width_ratios=[3, 2])
        width = 0.38
        for i, (label, stored, peak) in enumerate((("none", r["none_stored"], r["none_peak"]),
                                                   (r["policy"], r["stored"], r["peak"]))):
            left.bar(i - width / 2, stored / 1024, width, color="#4C72B0",
                     label="stored after forward" if i == 0 else None)
            left.bar(i + width / 2, peak / 1024, width, color="#C44E52", label="peak in backward" if i == 0 else None)
        if r["theory_peak"] is not None:
            left.plot([1 - width, 1], [r["theory_stored"] / 1024] * 2, color="black", lw=2, zorder=3,
                      label="formula on measured A, X\n(theory.checkpointed_activation_bytes)")
            left.plot([1, 1 + width], [r["theory_peak"] / 1024] * 2, color="black", lw=2, zorder=3)
        left.plot([-width, 0], [r["n"] * r["korthikanti_A"] / 1024] * 2, color="black", lw=2, ls=":", zorder=3,
                  label="n × Korthikanti's A (term by term)")
        k = f", k = {r['segment_layers']}" if r["segment_layers"] else ""
        left.set_xticks([0, 1], ["none", f"{r['policy']}{k}"])
        left.set_ylabel(f"KiB kept for backward ({r['counted_by']})")
        left.set_title(f"{r['n']} blocks: activations, measured", fontsize=9)
        legend_outside(left, "below", ncol=2, fontsize=8, bbox_to_anchor=(0.5, -0.14))
        right.bar([0, 1], [1000 * r["none_s"], 1000 * r["policy_s"]], color="#55A868")
        right.set_xticks([0, 1], ["none", r["policy"]])
        right.set_ylabel("ms per forward + backward (median)")
        right.set_title(f"recomputed forwards: {r['recomputed_forwards']};\ntime ×{r['policy_s'] / r['none_s']:.2f}"
                        " (measured)", fontsize=9)
        fig.tight_layout()
        self.image.value = png(fig)
        saved = 1 - r["peak"] / r["none_peak"]
        formula = "" if r["theory_peak"] is None else (
            f" (formula {r['theory_peak']:,.0f} B; the recomputed segment's first block saves the kept input "
            f"itself, so measured = formula − X when k divides n)")
        self.status.value = (f"peak {r['none_peak']:,} → <b>{r['peak']:,} B</b> ({saved:.0%} less){formula}; "
                             f"stored after forward {r['stored']:,} B; step time ×{r['policy_s'] / r['none_s']:.2f} "
                             f"(measured medians, noisy on a shared CPU); √n = {math.sqrt(r['n']):.1f}")

    def __repr__(self) -> str:
        return "CheckpointingPanel: an interactive panel — run this notebook in Jupyter to use it"

    def _repr_mimebundle_(self, **kwargs):
        return mimebundle(self, **kwargs)
