"""The course's interactive panels, and the small tables and pictures its notebooks show.

    from zerokit import course
    course.MemoryPanel(work, strategies=("ddp", "zero1"))
    course.table(rows)

A panel is an ipywidgets box that runs real, small jobs through :func:`zerokit.train`
(so through :func:`zerokit.launch`) whenever a control changes or Run is clicked, and
shows what the ledgers measured as a picture, next to :mod:`zerokit.theory`. One file
per thing a lesson shows:

- :mod:`.memory_panel`: :class:`MemoryPanel` (strategies, world size, precision →
  per-rank memory bars, measured vs the formula) and :func:`peak_bars`;
- :mod:`.timeline_panel`: :class:`TimelinePanel` (a strategy's options: bucket size,
  overlap, ZeRO-3's prefetch and reshard_after_forward → per-rank timeline with the
  exposed communication shaded) and the readers of its records;
- :mod:`.pipeline_panel`: :class:`PipelinePanel` (stages, micro-batches, schedule,
  chunks → the simulated schedule drawn, its bubble next to (p − 1)/(v·m + p − 1));
- :mod:`.grid_panel`: :class:`GridPanel` (dp, tp, pp degrees and the ZeRO stage on dp →
  per-rank memory bars and per-axis traffic, ledger vs theory) and :func:`grid_rows`;
- :mod:`.ring_panel`: :class:`CollectivePanel` (collective, world size, payload → the
  ring's rounds and the bytes each rank sent) and :func:`ring_schedule_figure`;
- :mod:`.latency_bandwidth`: timing the ring all-reduce and fitting the α-β model;
- :mod:`.tables`, :mod:`.figures`, :mod:`.machine`: tables, figure plumbing, and what
  this machine gives each world size;
- :mod:`.panel`: the base every panel shares.

The helpers read reports and ledgers; none of them trains or re-types a formula.
"""
from .figures import DPI, new_figure, png, volume_figure
from .latency_bandwidth import fit_latency_bandwidth, latency_bandwidth_figure, modelled_seconds, time_ring_all_reduce
from .machine import machine_summary
from .grid_panel import GridPanel, grid_rows
from .memory_panel import MemoryPanel, peak_bars
from .panel import Panel
from .pipeline_panel import PipelinePanel
from .plan_panel import PlanPanel, plan_bars
from .ring_panel import CollectivePanel, ring_schedule_figure
from .tables import Table, model_state_rows, summary_rows, table
from .timeline_panel import TimelinePanel, comm_launch_positions, max_in_flight, timeline_rows

__all__ = ["MemoryPanel", "TimelinePanel", "CollectivePanel", "Panel", "Table", "table", "model_state_rows",
           "summary_rows", "timeline_rows", "comm_launch_positions", "max_in_flight", "peak_bars",
           "ring_schedule_figure", "volume_figure", "time_ring_all_reduce", "fit_latency_bandwidth",
           "modelled_seconds", "latency_bandwidth_figure", "machine_summary", "DPI", "new_figure", "png",
           "PlanPanel", "plan_bars", "PipelinePanel", "GridPanel", "grid_rows"]
