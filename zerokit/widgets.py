"""The course's interactive panels, and the small tables and pictures its notebooks show.

A panel is an ipywidgets box that runs real, small jobs through :func:`zerokit.train`
(so through :func:`zerokit.launch`) whenever a control changes or Run is clicked, and
shows what the ledgers measured as a picture, next to :mod:`zerokit.theory`:

- :class:`MemoryPanel`: strategies, world size, precision → per-rank memory bars,
  measured (stacked) vs the formula (a black tick);
- :class:`TimelinePanel`: a strategy's options (bucket size, overlap, prefetch,
  reshard_after_forward) → per-rank timeline with the exposed communication shaded,
  and optionally the peak memory per rank;
- :class:`CollectivePanel`: collective, world size, payload → the ring's rounds and the
  bytes each rank sent on send/recv (:mod:`zerokit.ring`).

The helpers below them (``table``, ``summary_rows``, ``peak_bars``, ``ring_schedule_figure``,
``volume_figure``, ``fit_latency_bandwidth``, ``comm_launch_positions``, ``max_in_flight``)
read reports and ledgers; none of them trains or re-types a formula.

Panels draw into an ``ipywidgets.Image`` and print nothing, so no text leaks into a
cell's output under nbval (FACTS §9). Their callbacks are plain methods: a test sets a
control's ``value`` or calls ``run_button.click()`` and reads ``last_report``.
"""
from __future__ import annotations

import html
import io
import math
import time
from typing import Dict, Iterable, Optional, Sequence

from . import theory

#: pixels per inch of every picture the panels and helpers render (small files)
DPI = 80


# --- tables -----------------------------------------------------------------------------------

def _format(value) -> str:
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        if abs(value) >= 1000:
            return f"{value:,.1f}"
        return f"{value:.4g}"
    return str(value)


class Table:
    """Rows of dicts shown as an HTML table in a notebook and as aligned text elsewhere."""

    def __init__(self, rows: Sequence[dict], columns: Optional[Sequence[str]] = None, title: str = ""):
        self.rows = [dict(r) for r in rows]
        self.columns = list(columns) if columns is not None else list(self.rows[0]) if self.rows else []
        self.title = title

    def cells(self) -> list:
        return [[_format(r.get(c)) for c in self.columns] for r in self.rows]

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>"
                       for row in self.cells())
        caption = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def __repr__(self) -> str:
        cells = self.cells()
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(self.columns)]
        lines = [self.title] if self.title else []
        lines.append("  ".join(c.rjust(w) for c, w in zip(self.columns, widths)))
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
        return "\n".join(lines)

    __str__ = __repr__


def table(rows: Sequence[dict], columns: Optional[Sequence[str]] = None, title: str = "") -> Table:
    """A table of ``rows`` (dicts); ``columns`` picks and orders the keys shown."""
    return Table(rows, columns, title)


def model_state_rows(report) -> list:
    """One row per strategy and rank: model-state bytes measured and the theory's, by category."""
    rows = []
    for result in report.results:
        for rank in result.ranks:
            t = rank.theory_model_states
            for category in ("params", "grads", "optimizer"):
                rows.append({"strategy": result.strategy, "N": result.world_size, "rank": rank.rank,
                             "category": category, "measured B": rank.model_state_bytes[category],
                             "theory B": t[category]})
            rows.append({"strategy": result.strategy, "N": result.world_size, "rank": rank.rank,
                         "category": "total", "measured B": sum(rank.model_state_bytes.values()),
                         "theory B": t["total"]})
    return rows


def summary_rows(report) -> list:
    """One row per strategy: rank 0's model states and every rank's traffic, measured vs theory."""
    rows = []
    for result in report.results:
        rank0 = result.ranks[0]
        rows.append({"strategy": result.strategy, "N": result.world_size, "precision": result.precision,
                     "model states B": sum(rank0.model_state_bytes.values()),
                     "theory B": rank0.theory_model_states["total"],
                     "sent B/step": max(r.comm_bytes_sent_per_step for r in result.ranks),
                     "theory sent B/step": rank0.theory_comm_bytes_per_step,
                     "calls/step": rank0.comm_calls_per_step,
                     "peak B": max(r.peak_bytes for r in result.ranks),
                     "|Δparam| vs single": result.max_abs_param_diff})
    return rows


# --- pictures ---------------------------------------------------------------------------------

def new_figure(width: float, height: float, ncols: int = 1, width_ratios=None):
    """A matplotlib Figure not registered with pyplot (so a cell never shows it by accident), and its axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    if ncols == 1:
        return fig, fig.add_subplot(1, 1, 1)
    return fig, fig.subplots(1, ncols, gridspec_kw={"width_ratios": width_ratios} if width_ratios else None)


def png(fig) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def peak_bars(report, ax=None):
    """Stacked peak bytes per rank and strategy by category (activations and buffers too), theory's model states as a tick."""
    from .plot import CATEGORY_COLORS

    if ax is None:
        _, ax = new_figure(max(4, 1.2 * sum(len(r.ranks) for r in report.results)), 3.5)
    labels, x = [], 0
    mixed = len({r.precision for r in report.results}) > 1
    for result in report.results:
        for rank in result.ranks:
            bottom = 0.0
            for category, color in CATEGORY_COLORS.items():
                value = rank.peak_breakdown.get(category, 0) / 2**20
                ax.bar(x, value, bottom=bottom, color=color, label=category if x == 0 else None)
                bottom += value
            ax.plot([x - 0.4, x + 0.4], [rank.theory_model_states["total"] / 2**20] * 2, color="black", lw=2,
                    label="theory: model states" if x == 0 else None)
            labels.append(f"{result.strategy}\n{result.precision + ' ' if mixed else ''}r{rank.rank}")
            x += 1
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("MiB per rank at its peak")
    ax.set_title("peak memory per rank, by category (measured)", fontsize=9)
    ax.legend(fontsize=7)
    return ax


def ring_schedule_figure(n: int, op: str = "all_reduce", ax=None):
    """The ring's rounds as a grid: one row per rank, one column per round, the chunk each rank sends.

    Drawn from :func:`zerokit.ring.ring_schedule`: reduce-scatter rounds in orange,
    all-gather rounds in green; "c2 → r1" means "sends chunk 2 to rank 1". Returns the
    figure (a new one unless ``ax`` is given).
    """
    from .runtime.ring import ring_phase, ring_schedule

    rounds = len(ring_schedule(op, n, 0))
    if ax is None:
        fig, ax = new_figure(1.2 + 0.9 * rounds, 0.6 + 0.5 * n)
    colors = {"reduce_scatter": "#DD8452", "all_gather": "#55A868"}
    for rank in range(n):
        y = n - 1 - rank
        for step in ring_schedule(op, n, rank):
            ax.add_patch(_rectangle(step.round, y, colors[ring_phase(op, n, step.round)]))
            ax.text(step.round + 0.5, y + 0.5, f"c{step.send_chunk} → r{(rank + 1) % n}", ha="center",
                    va="center", fontsize=7 if rounds > 8 else 8)
    ax.set_xlim(0, rounds)
    ax.set_ylim(0, n)
    ax.set_xticks([k + 0.5 for k in range(rounds)], [str(k + 1) for k in range(rounds)], fontsize=8)
    ax.set_yticks([n - 1 - r + 0.5 for r in range(n)], [f"rank {r}" for r in range(n)], fontsize=8)
    ax.set_xlabel("round", fontsize=8)
    halves = " + ".join(p.replace("_", "-") for p in ("reduce_scatter", "all_gather")
                        if any(ring_phase(op, n, k) == p for k in range(rounds)))
    ax.set_title(f"ring {op.replace('_', '-')} on {n} ranks: {rounds} rounds ({halves})", fontsize=9)
    ax.figure.tight_layout()
    return ax.figure


def _rectangle(x, y, color):
    from matplotlib.patches import Rectangle

    return Rectangle((x + 0.04, y + 0.08), 0.92, 0.84, color=color, alpha=0.6)


def volume_figure(series: Dict[str, dict], ylabel: str = "bytes sent per rank", title: str = "",
                  reference: Optional[tuple] = None):
    """Measured points (markers) and theory (line) against the world size, one series per name.

    ``series[name] = {"N": [...], "measured": [...], "theory": [...]}``, with optionally
    ``"theory_N"`` when the theory line is drawn at other world sizes than the measurements.
    ``reference = (value, label)`` adds a dashed horizontal line (an asymptote).
    """
    fig, ax = new_figure(5.5, 3.2)
    for i, (name, s) in enumerate(series.items()):
        color = f"C{i}"
        ax.plot(s.get("theory_N", s["N"]), s["theory"], color=color, lw=1.5, label=f"{name}: theory")
        ax.plot(s["N"], s["measured"], "o", color=color, ms=6, label=f"{name}: measured")
    if reference is not None:
        ax.axhline(reference[0], color="#999999", ls="--", lw=1, label=reference[1])
    ax.set_xlabel("world size N")
    ax.set_xticks(sorted({n for s in series.values() for n in s.get("theory_N", s["N"])}))
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _time_ring_all_reduce(ctx, payload_bytes: Sequence[int], repeats: int) -> list:
    """On each rank: the fastest of ``repeats`` ring all-reduces per payload, and the bytes it sent."""
    import torch
    import torch.distributed as dist

    from .runtime import comm
    from .runtime.ring import ring_all_reduce

    out = []
    for size in payload_bytes:
        x = torch.ones(size // 4, device=ctx.device)
        ring_all_reduce(x)  # warm-up: the first call of a size allocates
        best = math.inf
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            ring_all_reduce(x)
            if x.is_cuda:
                torch.cuda.synchronize(x.device)
            best = min(best, time.perf_counter() - start)
        record = comm.ledger().records[-1]
        out.append({"payload_bytes": record.payload_bytes, "bytes_sent": record.bytes_sent, "seconds": best})
    return out


def time_ring_all_reduce(world_sizes: Sequence[int], payload_bytes: Sequence[int], repeats: int = 3) -> list:
    """Time :func:`zerokit.ring.ring_all_reduce` of fp32 tensors on each world size, through zerokit.launch.

    Returns one point per (world size, payload): ``op``, ``n``, ``payload_bytes``, the
    ``bytes_sent`` the ring really sent (rank 0's ledger) and ``seconds``, the slowest
    rank's fastest call.
    """
    from .runtime.launcher import launch

    points = []
    for n in world_sizes:
        per_rank = launch(_time_ring_all_reduce, n, list(payload_bytes), repeats)
        for i, point in enumerate(per_rank[0]):
            points.append({"op": "all_reduce", "n": n, "payload_bytes": point["payload_bytes"],
                           "bytes_sent": point["bytes_sent"],
                           "seconds": max(rank[i]["seconds"] for rank in per_rank)})
    return points


def fit_latency_bandwidth(points: Iterable[dict]) -> dict:
    """Least-squares fit of t = rounds·α + bytes_sent/β to measured collectives.

    Each point has ``op``, ``n``, ``payload_bytes`` and ``seconds``; rounds and bytes
    sent come from :func:`zerokit.theory.ring_steps` and :func:`~zerokit.theory.ring_bytes_sent`.
    Residuals are relative, so the small calls that fix α count as much as the large
    ones that fix β. Returns ``{"alpha_s": latency per round, "beta_Bps": bandwidth}``.
    """
    import numpy as np

    points = list(points)
    a = np.array([[theory.ring_steps(p["op"], p["n"]), theory.ring_bytes_sent(p["op"], p["payload_bytes"], p["n"])]
                  for p in points], dtype=float)
    t = np.array([p["seconds"] for p in points], dtype=float)
    # relative residuals: small calls (latency) and large ones (bandwidth) weigh alike
    (alpha, inv_beta), *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
    return {"alpha_s": float(alpha), "beta_Bps": float(1 / inv_beta) if inv_beta > 0 else math.inf}


def modelled_seconds(fit: dict, op: str, payload_bytes: int, n: int) -> dict:
    """The α-β model's time for one collective, split into its latency and bandwidth terms."""
    latency = theory.ring_steps(op, n) * fit["alpha_s"]
    bandwidth = theory.ring_bytes_sent(op, payload_bytes, n) / fit["beta_Bps"]
    return {"latency_s": latency, "bandwidth_s": bandwidth, "total_s": latency + bandwidth,
            "latency_share": latency / (latency + bandwidth)}


def latency_bandwidth_figure(points: Sequence[dict], fit: dict):
    """Measured seconds against payload size per world size, with the α-β fit as lines (log-log)."""
    fig, ax = new_figure(5.5, 3.2)
    by_n: dict = {}
    for p in points:
        by_n.setdefault(p["n"], []).append(p)
    for i, (n, pts) in enumerate(sorted(by_n.items())):
        pts = sorted(pts, key=lambda p: p["payload_bytes"])
        sizes = [p["payload_bytes"] for p in pts]
        model = [modelled_seconds(fit, p["op"], p["payload_bytes"], n)["total_s"] for p in pts]
        ax.plot(sizes, [1e3 * p["seconds"] for p in pts], "o", color=f"C{i}", label=f"N={n} measured")
        ax.plot(sizes, [1e3 * m for m in model], color=f"C{i}", lw=1, label=f"N={n} α-β fit")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("all-reduce payload S (bytes)")
    ax.set_ylabel("ms per call")
    ax.set_title(f"fit: α = {1e6 * fit['alpha_s']:.0f} µs per round, β = {fit['beta_Bps'] / 2**20:.0f} MiB/s",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def machine_summary(world_sizes: Sequence[int] = (1, 2, 4)) -> str:
    """Which backend and device :func:`zerokit.launch` gives each world size on this machine."""
    import torch

    gpus = torch.cuda.device_count()
    lines = [f"torch {torch.__version__.split('+')[0]}; CUDA devices visible: {gpus}"]
    for n in world_sizes:
        where = "NCCL, one GPU per rank" if gpus >= n else "gloo, CPU ranks"
        lines.append(f"  world_size={n}: {where}")
    if gpus == 1:
        lines.append("  one GPU: single-rank cells run on it; every multi-rank cell uses CPU ranks (gloo)")
    return "\n".join(lines)


# --- panels -----------------------------------------------------------------------------------

def _widgets():
    import ipywidgets

    return ipywidgets


class _Panel:
    """What every panel shares: a Run button, progress, status, the picture, and running jobs one by one."""

    def _build_common(self):
        w = _widgets()
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.run_button.on_click(lambda _: self.run())
        self.progress = w.IntProgress(value=0, min=0, max=1, description="jobs", layout=w.Layout(width="260px"))
        self.status = w.HTML(value="")
        self.image = w.Image(format="png")
        self.details = w.HTML(value="")
        self.last_report = None
        self.last_error: Optional[str] = None
        #: how many times the panel has run (a test reads it)
        self.runs = 0

    def _train_all(self, jobs: Sequence[tuple]) -> Optional[object]:
        """Run ``(strategy, world_size, kwargs)`` jobs through zerokit.train, advancing the progress bar."""
        from .report import Report
        from .train import train

        self.progress.max = len(jobs)
        self.progress.value = 0
        self.run_button.disabled = True
        results, start = [], time.perf_counter()
        try:
            for i, (strategy, n, kwargs) in enumerate(jobs):
                self.status.value = f"running <b>{html.escape(strategy)}</b> on {n} ranks ({i + 1}/{len(jobs)})…"
                results.append(train(self.workload, strategy, world_size=n, reference=False, **kwargs).result)
                self.progress.value = i + 1
        except Exception as exc:  # shown in the panel: a callback's exception would go to a log nobody reads
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.status.value = f"<span style='color:#C44E52'>{html.escape(self.last_error)}</span>"
            return None
        finally:
            self.run_button.disabled = False
        self.last_error = None
        self.status.value = f"{len(jobs)} job(s) in {time.perf_counter() - start:.1f} s"
        return Report(results)

    def _run_and_draw(self, jobs: Sequence[tuple]) -> Optional[object]:
        """Run the jobs; on success keep the report, count the run and redraw the picture."""
        report = self._train_all(jobs)
        if report is not None:
            self.last_report = report
            self.runs += 1
            self.draw()
        return report

    def __repr__(self) -> str:
        return (f"{type(self).__name__} for {self.workload.name}: an interactive panel — run this notebook in "
                f"Jupyter to use it")

    def _repr_mimebundle_(self, **kwargs):
        return self.box._repr_mimebundle_(**kwargs) | {"text/plain": repr(self)}


class MemoryPanel(_Panel):
    """Strategies × world size × precision → per-rank memory bars, measured vs :mod:`zerokit.theory`.

    ``view`` "model states" draws params, grads and optimizer states after the last
    step (exact, against the formula); "peak" draws each rank's peak by category,
    activations and buffers included.
    """

    VIEWS = ("model states", "peak")

    def __init__(self, workload, strategies: Sequence[str] = ("ddp", "zero1", "zero2", "zero3"),
                 world_sizes: Sequence[int] = (1, 2, 4), precisions: Sequence[str] = theory.PRECISIONS,
                 world_size: Optional[int] = None, precision: Optional[str] = None, steps: int = 2,
                 view: str = "model states", auto_run: bool = False, run: bool = True):
        w = _widgets()
        self.workload, self.steps, self.auto_run = workload, steps, auto_run
        self._build_common()
        self.strategies = w.SelectMultiple(options=list(strategies), value=tuple(strategies), description="strategies",
                                           rows=min(len(strategies), 6))
        if world_size is None:
            world_size = 2 if 2 in world_sizes else world_sizes[0]
        self.world_size = w.SelectionSlider(options=list(world_sizes), value=world_size, description="world size",
                                            continuous_update=False)
        self.precision = w.ToggleButtons(options=list(precisions), value=precision or precisions[0],
                                         description="precision")
        self.view = w.ToggleButtons(options=list(self.VIEWS), value=view, description="show")
        for control in (self.strategies, self.world_size, self.precision):
            control.observe(self._changed, names="value")
        self.view.observe(lambda _: self.draw(), names="value")
        controls = w.HBox([w.VBox([self.world_size, self.precision, self.view]), self.strategies])
        self.box = w.VBox([controls, w.HBox([self.run_button, self.progress, self.status]), self.image,
                           self.details])
        if run:
            self.run()

    def _changed(self, change) -> None:
        if self.auto_run:
            self.run()

    def run(self):
        """Train every selected strategy at the chosen world size and precision, then draw."""
        jobs = [(s, self.world_size.value, dict(steps=self.steps, precision=self.precision.value))
                for s in self.strategies.value]
        if not jobs:
            self.status.value = "choose at least one strategy"
            return None
        return self._run_and_draw(jobs)

    def draw(self) -> None:
        report = self.last_report
        if report is None:
            return
        from .plot import memory_bars

        bars = sum(len(r.ranks) for r in report.results)
        fig, ax = new_figure(min(11.0, max(4.5, 0.6 * bars + 1.5)), 3.4)
        if self.view.value == "peak":
            peak_bars(report, ax=ax)
        else:
            memory_bars(report, ax=ax)
            ax.title.set_fontsize(9)
        first = report.results[0]
        ax.set_xlabel(f"{self.workload.name}, Ψ = {first.param_count:,}, N = {first.world_size}, {first.precision}",
                      fontsize=8)
        fig.tight_layout()
        self.image.value = png(fig)
        self.details.value = table(summary_rows(report), ["strategy", "model states B", "theory B", "sent B/step",
                                                          "theory sent B/step", "peak B"])._repr_html_()


def _ring_collective(ctx, op: str, numel: int) -> dict:
    """On each rank: one ring ``op`` of ``numel`` fp32 elements; its rounds, bytes sent and seconds."""
    import torch
    import torch.distributed as dist

    from .runtime import comm, ring

    n = ctx.world_size
    rounds = []
    count = lambda k, send, recv, phase: rounds.append(phase)  # noqa: E731
    dist.barrier()
    start = time.perf_counter()
    device = ctx.device
    if op == "all_reduce":
        ring.ring_all_reduce(torch.ones(numel, device=device), on_step=count)
    elif op == "reduce_scatter":
        ring.ring_reduce_scatter(torch.empty(numel // n, device=device), torch.ones(numel, device=device),
                                 on_step=count)
    else:
        ring.ring_all_gather(torch.empty(numel, device=device), torch.ones(numel // n, device=device),
                             on_step=count)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    record = comm.ledger().records[-1]
    return {"rank": ctx.rank, "rounds": len(rounds), "payload_bytes": record.payload_bytes,
            "bytes_sent": record.bytes_sent, "seconds": seconds}


class CollectivePanel(_Panel):
    """Collective × world size × payload → the ring's rounds, and the bytes each rank really sent.

    Runs :mod:`zerokit.ring` on send/recv through :func:`zerokit.launch`, so the bytes are
    counted as they are sent; the picture puts them next to
    :func:`zerokit.theory.ring_bytes_sent`. The trade-off it shows: more ranks mean more
    rounds (latency), while the bytes per rank stay under 2× the payload (bandwidth).
    """

    def __init__(self, ops: Sequence[str] = ("all_reduce", "reduce_scatter", "all_gather"),
                 world_sizes: Sequence[int] = (2, 3, 4, 6, 8), payload_kib: Sequence[int] = (4, 64, 1024),
                 world_size: int = 4, auto_run: bool = True, run: bool = True):
        w = _widgets()
        self.auto_run = auto_run
        self._build_common()
        self.progress.description = "ranks"
        self.op = w.ToggleButtons(options=list(ops), value=ops[0], description="collective")
        self.world_size = w.SelectionSlider(options=list(world_sizes), value=world_size, description="world size",
                                            continuous_update=False)
        self.payload_kib = w.SelectionSlider(options=list(payload_kib), value=payload_kib[len(payload_kib) // 2],
                                             description="payload KiB", continuous_update=False)
        for control in (self.op, self.world_size, self.payload_kib):
            control.observe(self._changed, names="value")
        self.box = w.VBox([self.op, w.HBox([self.world_size, self.payload_kib]),
                           w.HBox([self.run_button, self.progress, self.status]), self.image, self.details])
        #: per-rank results of the last run
        self.last_result: Optional[list] = None
        if run:
            self.run()

    def __repr__(self) -> str:
        return f"{type(self).__name__}: an interactive panel — run this notebook in Jupyter to use it"

    def _changed(self, change) -> None:
        if self.auto_run:
            self.run()

    def run(self):
        from .runtime.launcher import launch

        op, n = self.op.value, self.world_size.value
        numel = max(n, (self.payload_kib.value * 1024 // 4) // n * n)
        self.progress.max, self.progress.value = 1, 0
        self.status.value = f"running a ring {op} on {n} ranks…"
        start = time.perf_counter()
        try:
            result = launch(_ring_collective, n, op, numel)
        except Exception as exc:  # shown in the panel rather than lost in a callback
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.status.value = f"<span style='color:#C44E52'>{html.escape(self.last_error)}</span>"
            return None
        self.last_error = None
        self.progress.value = 1
        self.status.value = f"{n} ranks in {time.perf_counter() - start:.1f} s"
        self.last_result = result
        self.runs += 1
        self.draw()
        return result

    def draw(self) -> None:
        result, op, n = self.last_result, self.op.value, self.world_size.value
        rounds = _rounds(op, n)
        fig, (left, right) = new_figure(min(14, 3.5 + 0.8 * rounds), 1.0 + 0.45 * n, ncols=2,
                                        width_ratios=[max(3, rounds / 2), 1.2])
        ring_schedule_figure(n, op, ax=left)
        payload = result[0]["payload_bytes"]
        expected = theory.ring_bytes_sent(op, payload, n)
        right.bar(range(n), [r["bytes_sent"] / 1024 for r in result], color="#4C72B0", label="measured")
        right.plot([-0.4, n - 0.6], [expected / 1024] * 2, color="black", lw=2, label="theory")
        right.plot([-0.4, n - 0.6], [payload / 1024] * 2, color="#999999", lw=1, ls="--", label="payload S")
        right.set_xticks(range(n), [f"r{r}" for r in range(n)], fontsize=8)
        right.set_ylabel("KiB sent per rank", fontsize=8)
        right.set_title(f"{result[0]['rounds']} rounds", fontsize=9)
        right.legend(fontsize=7)
        fig.tight_layout()
        self.image.value = png(fig)
        rows = [{"rank": r["rank"], "rounds": r["rounds"], "theory rounds": _rounds(op, n),
                 "sent B": r["bytes_sent"], "theory sent B": expected, "ms": round(1e3 * r["seconds"], 2)}
                for r in result]
        self.details.value = table(rows)._repr_html_()


def _rounds(op: str, n: int) -> int:
    return theory.ring_steps(op, n)


def _option_control(name: str, spec, w):
    if isinstance(spec, bool):
        return w.Checkbox(value=spec, description=name, indent=False)
    choices = list(spec)
    return w.SelectionSlider(options=choices, value=choices[len(choices) // 2], description=name,
                             continuous_update=False, style={"description_width": "initial"},
                             layout=w.Layout(width="420px"))


class TimelinePanel(_Panel):
    """A strategy's options → the per-rank timeline, exposed communication shaded (and peak memory).

    ``controls`` maps option names to a sequence of choices (a slider) or a bool (a
    checkbox), e.g. ``{"bucket_mb": [0.01, 0.03, 0.1], "overlap": True}``. With several
    ``strategies`` a dropdown picks one; a control the chosen strategy does not accept is
    disabled. Every change re-runs the job and redraws.
    """

    def __init__(self, workload, strategies: Sequence[str] | str = "ddp", controls: Optional[Dict] = None,
                 world_size: int = 2, steps: int = 3, precision: str = "fp32", show_memory: bool = False,
                 draw_steps: Optional[range] = None, fixed: Optional[Dict] = None, auto_run: bool = True,
                 run: bool = True):
        from .strategies import get

        w = _widgets()
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
        self.strategy.observe(self._changed, names="value")
        for control in self.controls.values():
            control.observe(self._changed, names="value")
        self._enable_controls()
        top = ([self.strategy] if len(names) > 1 else []) + list(self.controls.values())
        self.box = w.VBox([w.HBox(top, layout=w.Layout(flex_flow="row wrap")),
                           w.HBox([self.run_button, self.progress, self.status]), self.image, self.details])
        if run:
            self.run()

    def _accepted(self) -> set:
        from .strategies import get

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
        kwargs = dict(steps=self.steps, precision=self.precision, keep_records=True, **self.options())
        return self._run_and_draw([(self.strategy.value, self.world_size, kwargs)])

    def draw(self) -> None:
        from .plot import timeline

        report = self.last_report
        n = len(report.result.ranks)
        if self.show_memory:
            fig, (ax, mem) = new_figure(11, 1.6 + 0.9 * n, ncols=2, width_ratios=[4, 1])
        else:
            fig, ax = new_figure(10, 1.6 + 0.9 * n)
        _, exposed = timeline(report, ax=ax, steps=self.draw_steps)
        if self.show_memory:
            peaks = [r.peak_bytes / 2**20 for r in report.result.ranks]
            mem.bar(range(n), peaks, color="#8172B3")
            mem.set_xticks(range(n), [f"r{r.rank}" for r in report.result.ranks], fontsize=8)
            mem.set_ylabel("peak MiB", fontsize=8)
            mem.set_title("peak memory", fontsize=9)
        fig.tight_layout()
        self.image.value = png(fig)
        self.last_exposed_s = exposed
        self.details.value = table(timeline_rows(report, self.draw_steps))._repr_html_()


def comm_launch_positions(rank_result, step: int) -> dict:
    """How many of a step's collectives a rank launched while backward was still computing, and after.

    "Computing" ends with the last leaf module's backward of that step (from the tracer of
    ``train(..., keep_records=True)``): a collective launched before then can hide behind
    the rest of backward; one launched after can only be waited for.
    """
    from .runtime.timeline import rank_timeline

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
    """Per rank: calls and bytes per step (measured, theory), exposed communication, step time, peak."""
    from .runtime.timeline import exposed_comm_s

    result = report.result
    steps = steps if steps is not None else range(len(result.ranks[0].step_times_s))
    rows = []
    for rank in result.ranks:
        rows.append({"strategy": result.strategy, "rank": rank.rank,
                     "calls/step": rank.comm_calls_per_step,
                     "sent B/step": rank.comm_bytes_sent_per_step,
                     "theory B/step": rank.theory_comm_bytes_per_step,
                     "exposed ms/step": round(1e3 * exposed_comm_s(rank, steps=steps) / len(steps), 2),
                     "step ms": round(1e3 * sum(rank.step_times_s[s] for s in steps) / len(steps), 2),
                     "peak B": rank.peak_bytes})
    return rows
