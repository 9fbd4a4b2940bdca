"""Context parallelism: the cp degree and the attention algorithm → activation bytes and bytes per axis, measured.

:class:`ContextPanel` trains the workload (a tiny GPT) for real through :func:`zerokit.train`
(see :class:`~zerokit.course.panel.Panel`) whenever cp or the attention changes: once on one
process (cp = 1, the baseline) and once with the sequence cut over cp ranks
(``parallel={"cp": cp}``, ``cp_attention="ring" | "ulysses"``), and draws:

- left, the activation bytes each rank's memory ledger saw at its peak (the saved-tensor
  hooks), the one process's bar first, with the one process's ÷ cp as a black tick on
  each cp rank (the formula the lesson holds them to);
- right, per rank, the bytes put on each mesh axis per step — ``cp`` (the attention's
  ring transfers or all-to-alls) and ``dp_cp`` (the weights' gradients, reduced over the
  flattened dp × cp group) — as the ledger's ring cost next to
  :func:`zerokit.theory.ring_attention_bytes` / :func:`~zerokit.theory.ulysses_bytes` summed
  over the model's attention calls (hatched).

:func:`context_rows` gives the same numbers as table rows. A choice the model refuses
(Ulysses with heads that do not divide by cp, a sequence that does not cut into 2·cp
chunks) is shown in the status line.
"""
from __future__ import annotations

from typing import Optional, Sequence

from .figures import legend_outside, new_figure, png
from .panel import Panel, ipywidgets
from .tables import table

ATTENTIONS = ("ring", "ulysses")
AXES = ("cp", "dp_cp")
AXIS_COLORS = {"cp": "#C44E52", "dp_cp": "#4C72B0"}


def activation_bytes(rank) -> int:
    """Measured: the activations the rank's memory ledger held at their own peak (saved-tensor hooks)."""
    return int((rank.peak_by_category or rank.peak_breakdown).get("activations", 0))


def context_rows(report) -> list:
    """One row per rank of the cp run (the last result), next to the one process's activations ÷ cp."""
    single, run = report.results[0], report.results[-1]
    cp = (run.parallel or {}).get("cp", 1)
    base = activation_bytes(single.ranks[0])
    rows = []
    for rank in sorted(run.ranks, key=lambda r: r.rank):
        measured = {a: ((rank.comm_bytes_by_axis or {}).get(a, {}).get("ring_cost_bytes") or 0) for a in AXES}
        rows.append({"rank": rank.rank, "activations B (ledger)": activation_bytes(rank),
                     "one process ÷ cp (formula)": base / cp,
                     "cp B/step (ledger)": measured["cp"],
                     "cp B/step (theory)": (rank.theory_comm_bytes_by_axis or {}).get("cp", 0),
                     "dp_cp B/step (ledger)": measured["dp_cp"]})
    return rows


class ContextPanel(Panel):
    """cp degree and attention algorithm → activation bytes per rank and bytes per axis, ledger vs theory."""

    def __init__(self, workload, cp: int = 2, attention: str = "ring", degrees: Sequence[int] = (2, 4),
                 attentions: Sequence[str] = ATTENTIONS, steps: int = 1, report=None, auto_run: bool = True,
                 run: bool = True):
        w = ipywidgets()
        if attention not in attentions:
            raise ValueError(f"ContextPanel: attention={attention!r}; allowed: {', '.join(attentions)}")
        if cp not in degrees:
            raise ValueError(f"ContextPanel: cp={cp!r} is not among degrees={tuple(degrees)}")
        self.workload, self.steps, self.auto_run = workload, steps, auto_run
        self._build_common()
        #: the attention the last run (or the given report) used
        self.ran_attention = attention
        self.cp = w.ToggleButtons(options=list(degrees), value=cp, description="cp", style={"button_width": "48px"})
        self.attention = w.ToggleButtons(options=list(attentions), value=attention, description="attention",
                                         style={"button_width": "72px"})
        #: what the last picture drew: {"activations": [one process, rank 0, …], "traffic": {axis: [...]}}
        self.bars: dict = {}
        for control in (self.cp, self.attention):
            control.observe(self._changed, names="value")
        self.box = w.VBox([w.HBox([self.cp, self.attention]), w.HBox([self.run_button, self.progress, self.status]),
                           self.image, self.details])
        if report is not None:
            self.last_report = report
            self.draw()
        elif run:
            self.run()

    def run(self):
        """One process, then the sequence cut over cp ranks with the chosen attention; then draw."""
        cp = self.cp.value
        self.ran_attention = self.attention.value
        return self._run_and_draw([("ddp", 1, dict(steps=self.steps)),
                                   ("ddp", cp, dict(steps=self.steps, parallel={"cp": cp},
                                                    cp_attention=self.attention.value))])

    def draw(self) -> None:
        report = self.last_report
        if report is None:
            return
        single, result = report.results[0], report.results[-1]
        cp = (result.parallel or {}).get("cp", 1)
        attention = self.ran_attention  # the job's options do not keep it: zerokit.train takes it apart
        ranks = sorted(result.ranks, key=lambda r: r.rank)
        base = activation_bytes(single.ranks[0])
        fig, (left, right) = new_figure(10.5, 3.9, ncols=2)
        acts = [base] + [activation_bytes(r) for r in ranks]
        left.bar(0, base / 2**10, 0.6, color="#999999", label="one process (ledger)")
        left.bar(range(1, len(ranks) + 1), [a / 2**10 for a in acts[1:]], 0.6, color="#55A868",
                 label=f"cp = {cp}, {attention} (ledger)")
        for x in range(1, len(ranks) + 1):
            left.plot([x - 0.3, x + 0.3], [base / cp / 2**10] * 2, color="black", lw=2,
                      label="one process ÷ cp (formula)" if x == 1 else None)
        left.set_xticks(range(len(acts)), ["one\nprocess"] + [f"cp rank {r.rank}" for r in ranks], fontsize=8)
        left.set_ylabel("KiB of activations at their peak")
        left.set_title("activations per rank", fontsize=9)
        legend_outside(left, "below", ncol=1, bbox_to_anchor=(0.5, -0.2))
        width, traffic = 0.8 / len(AXES), {}
        for i, axis in enumerate(AXES):
            rows = [((r.comm_bytes_by_axis or {}).get(axis, {}).get("ring_cost_bytes") or 0) for r in ranks]
            formula = [(r.theory_comm_bytes_by_axis or {}).get(axis, 0) for r in ranks]
            xs = [x - 0.4 + width * (i + 0.25) for x in range(len(ranks))]
            right.bar(xs, [v / 2**10 for v in rows], width * 0.45, color=AXIS_COLORS[axis], label=f"{axis}: ledger")
            right.bar([x + width * 0.47 for x in xs], [v / 2**10 for v in formula], width * 0.45, color="white",
                      edgecolor=AXIS_COLORS[axis], hatch="///", label=f"{axis}: theory")
            traffic[axis] = rows
        right.set_xticks(range(len(ranks)), [f"cp rank {r.rank}" for r in ranks], fontsize=8)
        right.set_ylabel("KiB per rank per step")
        right.set_title(f"bytes per axis ({attention}): ring cost of the ledger's calls vs theory", fontsize=9)
        legend_outside(right, "below", ncol=2, bbox_to_anchor=(0.5, -0.2))
        tokens = self.workload.batch(0)[0].shape[1]
        fig.suptitle(f"{self.workload.name}: a sequence of {tokens} tokens cut over cp = {cp} ranks", fontsize=9)
        fig.tight_layout()
        self.image.value = png(fig)
        self.bars = {"activations": acts, "traffic": traffic}
        self.details.value = table(context_rows(report))._repr_html_()

