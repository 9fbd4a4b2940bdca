"""When communication happens: per-rank timelines, exposed communication, and what overlaps.

:class:`TimelinePanel` trains one strategy for a few steps with the options its controls
set (DDP's bucket size and overlap, ZeRO-2's reduce bucket, ZeRO-3's prefetch and
reshard_after_forward...) and the emulated link it trains behind (a dropdown of
:data:`zerokit.links.PRESETS`), keeping the traced records: a real job through
:func:`zerokit.train`, re-run at every change. It draws each rank's timeline
(:func:`.timeline_figure.timeline_figure`: exposed time on top, straggler waits apart and
named), optionally the peak memory per rank, and a table of :func:`timeline_rows` (medians
over the steps drawn; the few columns the picture needs: :data:`PANEL_COLUMNS`). :func:`comm_launch_positions` and :func:`max_in_flight` read the
same records for the lessons' tables: launched during or after backward, and how many
collectives were in flight at once (ZeRO-3's prefetch).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

from ..runtime.link import PRESETS
from ..runtime.timeline import exposed_comm_s, rank_timeline
from ..strategies import get
from .figures import png
from .panel import ipywidgets, Panel
from .tables import RING_COST, SENT, table, THEORY
from .timeline_figure import timeline_figure, timeline_stats


#: the columns of :func:`timeline_rows` the panel shows under its picture
PANEL_COLUMNS = ("rank", RING_COST, "exposed − wait ms/step", "straggler wait ms/step", "emulated held ms/step",
                 "step ms")


def _option_control(name: str, spec, w):
    if isinstance(spec, bool):
        return w.Checkbox(value=spec, description=name, indent=False)
    choices = list(spec)
    return w.SelectionSlider(options=choices, value=choices[len(choices) // 2], description=name,
                             continuous_update=False, style={"description_width": "initial"},
                             layout=w.Layout(width="420px"))


class TimelinePanel(Panel):
    """A strategy's options → the per-rank timeline, exposed communication shaded (and peak memory).

    ``controls`` maps option names to a sequence of choices (a slider) or a bool (a
    checkbox), e.g. ``{"bucket_mb": [0.01, 0.03, 0.1], "overlap": True}``. With several
    ``strategies`` a dropdown picks one; a control the chosen strategy does not accept is
    disabled. Every change re-runs the job and redraws.
    """

    def __init__(self, workload, strategies: Sequence[str] | str = "ddp", controls: Optional[Dict] = None,
                 world_size: int = 2, steps: int = 3, precision: str = "fp32", show_memory: bool = False,
                 draw_steps: Optional[range] = None, fixed: Optional[Dict] = None, auto_run: bool = True,
                 run: bool = True, link: str = "this machine"):
        w = ipywidgets()
        self.workload, self.world_size, self.steps, self.precision = workload, world_size, steps, precision
        self.show_memory, self.auto_run = show_memory, auto_run
        self.fixed = dict(fixed or {})
        #: steps drawn: the last one by default (the first has warm-up, and ZeRO-3 prefetch starts at step 2)
        self.draw_steps = draw_steps if draw_steps is not None else range(steps - 1, steps)
        names = [strategies] if isinstance(strategies, str) else list(strategies)
        for name in names:
            get(name)
        self._build_common()
        self.strategy = w.Dropdown(options=names, value=names[-1], description="strategy")
        self.controls = {name: _option_control(name, spec, w) for name, spec in (controls or {}).items()}
        #: the emulated link every collective completes through ("this machine": none)
        self.link = w.Dropdown(options=list(PRESETS), value=link, description="link")
        self.strategy.observe(self._changed, names="value")
        self.link.observe(self._changed, names="value")
        for control in self.controls.values():
            control.observe(self._changed, names="value")
        self._enable_controls()
        top = ([self.strategy] if len(names) > 1 else []) + list(self.controls.values()) + [self.link]
        self.box = w.VBox([w.HBox(top, layout=w.Layout(flex_flow="row wrap")),
                           w.HBox([self.run_button, self.progress, self.status]), self.image, self.details])
        if run:
            self.run()

    def _accepted(self) -> set:
        return set(get(self.strategy.value).options)

    def _enable_controls(self) -> None:
        accepted = self._accepted()
        for name, control in self.controls.items():
            control.disabled = name not in accepted

    def _changed(self, change) -> None:
        self._enable_controls()
        if self.auto_run:
            self.run()

    def options(self) -> dict:
        """The options the chosen strategy gets from the controls (and ``fixed``)."""
        accepted = self._accepted()
        chosen = {**self.fixed, **{name: c.value for name, c in self.controls.items()}}
        return {k: v for k, v in chosen.items() if k in accepted}

    def run(self):
        """Train the chosen strategy with the controls' options, keeping records, then draw."""
        kwargs = dict(steps=self.steps, precision=self.precision, keep_records=True, link=self.link.value,
                      **self.options())
        return self._run_and_draw([(self.strategy.value, self.world_size, kwargs)])

    def draw(self) -> None:
        report = self.last_report
        label = f"{self.strategy.value}, link {self.link.value}"
        fig = timeline_figure({label: report}, self.draw_steps, width=10)
        if self.show_memory:
            mem = fig.add_axes([0.87, 0.2, 0.11, 0.5])
            fig.subplots_adjust(right=0.82)
            n = len(report.result.ranks)
            mem.bar(range(n), [r.peak_bytes / 2**20 for r in report.result.ranks], color="#8172B3")
            mem.set_xticks(range(n), [f"r{r.rank}" for r in report.result.ranks], fontsize=8)
            mem.set_title("peak MiB", fontsize=9)
        self.image.value = png(fig)
        self.last_exposed_s = {r.rank: exposed_comm_s(r, steps=self.draw_steps) for r in report.result.ranks}
        self.details.value = table(timeline_rows(report, self.draw_steps), PANEL_COLUMNS)._repr_html_()


def comm_launch_positions(rank_result, step: int) -> dict:
    """How many of a step's collectives a rank launched while backward was still computing, and after.

    "Computing" ends with the last leaf module's backward of that step (from the tracer of
    ``train(..., keep_records=True)``): a collective launched before then can hide behind
    the rest of backward; one launched after can only be waited for.
    """
    line = rank_timeline(rank_result)
    ends = [m["end"] for m in line["modules"] if m["kind"] == "backward" and m["step"] == step]
    if not ends:
        raise ValueError(f"rank {rank_result.rank} traced no module backward in step {step}")
    backward_end = max(ends)
    launches = [c["start"] for c in line["comm"] if c["step"] == step and c["phase"] != "setup"]
    during = sum(t < backward_end for t in launches)
    return {"during backward": during, "after backward": len(launches) - during}


def max_in_flight(rank_result, op: str, step: int) -> int:
    """The most ``op`` collectives a rank had in flight at once in ``step`` (launch to known completion).

    1 means each was waited for before the next was launched; more means the next ones
    were launched ahead (ZeRO-3's prefetch, DDP's overlapped buckets).
    """
    records = [r for r in rank_result.comm_records if r["op"] == op and r["step"] == step and r["phase"] != "setup"]
    events = sorted([(r["t_launch"], 1) for r in records] +
                    [(r["t_end"] if r["t_end"] is not None else r["t_launch"], -1) for r in records],
                    key=lambda e: (e[0], e[1]))
    most = current = 0
    for _, change in events:
        current += change
        most = max(most, current)
    return most


def timeline_rows(report, steps: Optional[range] = None) -> list:
    """Per rank: calls and traffic per step, and medians over ``steps`` of the step, backward compute,
    exposed communication (of which waiting for a straggler, and sleeping for an emulated link; "exposed − wait":
    blocked once every rank had launched), peak.

    Traffic: the ring cost of the payloads the ledger measured (a formula), the bytes
    zerokit's ring counted on the wire (measured; — where the backend ran the collectives),
    and the theory's formula on Ψ and N.
    """
    result = report.result
    steps = steps if steps is not None else range(len(result.ranks[0].step_times_s))
    rows = []
    for rank, stats in zip(result.ranks, timeline_stats(report, steps)):
        rows.append({"strategy": result.strategy, "rank": rank.rank,
                     "calls/step": rank.comm_calls_per_step,
                     RING_COST: rank.comm_ring_cost_bytes_per_step,
                     SENT: rank.comm_sent_bytes_per_step,
                     THEORY: rank.theory_comm_bytes_per_step,
                     "exposed ms/step": round(stats["exposed ms"], 2),
                     "straggler wait ms/step": round(stats["straggler wait ms"], 2),
                     "exposed − wait ms/step": round(stats["exposed − wait ms"], 2),
                     "emulated held ms/step": round(stats["emulated held ms"], 2),
                     "backward ms": round(stats["backward ms"], 2),
                     "step ms": round(stats["step ms"], 2),
                     "peak B": rank.peak_bytes})
    return rows
