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
- :mod:`.timeline_figure`: :func:`timeline_figure` (runs compared on one shared time
  axis, exposed time on top, straggler waits named) and :func:`timeline_stats` (medians);
- :mod:`.pipeline_panel`: :class:`PipelinePanel` (stages, micro-batches, schedule,
  chunks → the simulated schedule drawn, its bubble next to (p − 1)/(v·m + p − 1));
- :mod:`.grid_panel`: :class:`GridPanel` (dp, cp, ep, tp, pp degrees and the ZeRO stage on dp →
  per-rank memory bars and per-axis traffic, ledger vs theory) and :func:`grid_rows`;
- :mod:`.offload_panel`: :class:`OffloadPanel` (ZeRO stage, offload, world size →
  device vs host bytes and the device↔host copies per step, ledgers vs theory) and
  :func:`offload_rows`, :func:`offload_bars`;
- :mod:`.checkpointing_panel`: :class:`CheckpointingPanel` (policy, k, blocks → activation
  bytes kept and step time, measured next to Chen et al.'s formula) and :func:`measure_policy`;
- :mod:`.ring_panel`: :class:`CollectivePanel` (collective, world size, payload → the
  ring's rounds and the bytes each rank sent) and :func:`ring_schedule_figure`;
- :mod:`.failure_panel`: :class:`FailurePanel` (a dropdown of failure labs → the lab run
  for real and zerokit's diagnosis of it: rank, op, call, phase) and :func:`run_lab`;
- :mod:`.latency_bandwidth`: timing the ring all-reduce, fitting the α-β model, and
  extrapolating a link's α and β to many ranks, ring against tree;
- :mod:`.quantization_panel`: :class:`QuantizationPanel` (block size, bits → each element's
  error against its block's scale/2 and the bytes against bf16, ZeRO++'s codec on real weights);
- :mod:`.saved_tensors`: what autograd saves for backward, tensor by tensor, by module;
- :mod:`.tables`, :mod:`.figures`, :mod:`.machine`: tables, figure plumbing, and what
  this machine gives each world size;
- :mod:`.panel`: the base every panel shares;
- :mod:`.claims`: sentences about speed chosen by the measured numbers
  (:func:`speed_sentence`), never typed.

The helpers read reports and ledgers; none of them trains or re-types a formula.
"""
from .failure_panel import Diagnosis, FailurePanel, run_lab
from .checkpointing_panel import CheckpointingPanel, measure_policy
from .claims import CLAIMS, share_words, speed_sentence, show
from .figures import DPI, new_figure, png, volume_figure
from .latency_bandwidth import (all_reduce_scaling_figure, fit_latency_bandwidth, latency_bandwidth_figure,
                                modelled_seconds, time_ring_all_reduce)
from .machine import machine_summary
from .grid_panel import GridPanel, grid_rows
from .memory_panel import MemoryPanel, peak_bars
from .offload_panel import OffloadPanel, offload_bars, offload_rows
from .panel import Panel
from .pipeline_panel import PipelinePanel
from .plan_panel import PlanPanel, plan_bars
from .ring_panel import CollectivePanel, ring_schedule_figure
from .saved_tensors import bytes_by_module, saved_tensors
from .tables import Table, model_state_rows, summary_rows, table
from .timeline_panel import TimelinePanel, comm_launch_positions, max_in_flight, timeline_rows
from .timeline_figure import timeline_figure, timeline_stats  # noqa: E402 - runs compared on one time axis
from .context_panel import ContextPanel  # noqa: E402 - context parallelism (lesson 15)
from .ring_overlap import ring_overlap_figure, ring_overlap_rows  # noqa: E402 - lesson 15
from .moe_panel import MoEPanel  # noqa: E402 - mixture of experts (lesson 16)
from .quantization_panel import QuantizationPanel, measure_quantization  # noqa: E402 - ZeRO++'s codec (lesson 17)

__all__ = ["MemoryPanel", "TimelinePanel", "CollectivePanel", "Panel", "Table", "table", "model_state_rows",
           "summary_rows", "timeline_rows", "comm_launch_positions", "max_in_flight", "peak_bars",
           "ring_schedule_figure", "volume_figure", "time_ring_all_reduce", "fit_latency_bandwidth",
           "modelled_seconds", "latency_bandwidth_figure", "all_reduce_scaling_figure", "saved_tensors",
           "bytes_by_module", "machine_summary", "DPI", "new_figure", "png",
           "PlanPanel", "plan_bars", "PipelinePanel", "OffloadPanel", "offload_rows", "offload_bars",
           "CheckpointingPanel", "measure_policy", "GridPanel", "grid_rows"]
__all__ += ["timeline_figure", "timeline_stats", "speed_sentence", "share_words", "show", "CLAIMS"]
__all__ += ["ContextPanel", "ring_overlap_figure", "ring_overlap_rows"]
__all__ += ["MoEPanel"]
__all__ += ["QuantizationPanel", "measure_quantization"]
