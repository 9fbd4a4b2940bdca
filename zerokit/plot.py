"""matplotlib pictures of what the ledgers measured."""
from __future__ import annotations

CATEGORY_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868",
                   "buffers": "#8172B3", "activations": "#C44E52"}


def memory_bars(report, ax=None, categories=("params", "grads", "optimizer")):
    """Stacked bytes per rank and strategy, measured, with the theory's total as a black tick."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(max(4, 1.2 * sum(len(r.ranks) for r in report.results)), 3.5))
    labels, x = [], 0
    for result in report.results:
        for rank in result.ranks:
            bottom = 0.0
            for c in categories:
                value = rank.model_state_bytes.get(c, rank.memory_bytes.get(c, 0)) / 2**20
                ax.bar(x, value, bottom=bottom, color=CATEGORY_COLORS[c], label=c if x == 0 else None)
                bottom += value
            theory_total = rank.theory_model_states["total"] / 2**20
            ax.plot([x - 0.4, x + 0.4], [theory_total] * 2, color="black", lw=2,
                    label="theory" if x == 0 else None)
            labels.append(f"{result.strategy}\nr{rank.rank}")
            x += 1
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("MiB per rank")
    ax.set_title("model states per rank: measured (bars) vs theory (line)")
    ax.legend(fontsize=8)
    return ax


# --- timelines ---------------------------------------------------------------------------------

TIMELINE_COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "step": "#55A868",
                   "comm": "#B8B0D8", "exposed": "#C44E52"}


def timeline(report_or_result, ax=None, steps=None, modules: bool = False):
    """Per-rank Gantt chart: compute on top (forward, backward, step), communication below.

    Each collective is drawn from its launch to its known completion; the part during
    which the rank was blocked on it — the *exposed* communication — is shaded red.
    ``report_or_result``: a Report (its first strategy), a StrategyResult or a list of
    RankResults from ``zerokit.train(..., keep_records=True)``. ``steps``: a range of
    training steps to draw (default: all). ``modules``: also draw every leaf module's
    forward and backward as thin bars. Returns ``(ax, {rank: exposed seconds})`` over
    the steps drawn.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from .runtime.timeline import exposed_comm_s, rank_timeline, ranks_of

    ranks = ranks_of(report_or_result)
    lines = [rank_timeline(r) for r in ranks]
    if steps is None:
        steps = range(max((c["step"] for line in lines for c in line["compute"]), default=0) + 1)
    keep = lambda item: item["step"] in steps  # noqa: E731
    starts = [c["start"] for line in lines for c in line["compute"] if keep(c)]
    if not starts:
        raise ValueError(f"no training step in steps={steps!r} was traced")
    t0 = min(starts)
    ms = lambda t: 1000 * (t - t0)  # noqa: E731
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.9 + 0.9 * len(lines)))
    exposed = {}
    for row, (rank, line) in enumerate(zip(ranks, lines)):
        y = len(lines) - 1 - row
        for c in filter(keep, line["compute"]):
            ax.broken_barh([(ms(c["start"]), ms(c["end"]) - ms(c["start"]))], (y + 0.05, 0.4),
                           color=TIMELINE_COLORS.get(c["name"], "#999999"))
        if modules:
            for m in filter(keep, line["modules"]):
                ax.broken_barh([(ms(m["start"]), ms(m["end"]) - ms(m["start"]))], (y + 0.38, 0.07),
                               color="black", alpha=0.5)
        for c in line["comm"]:
            if c["phase"] == "setup" or c["step"] not in steps:
                continue
            ax.broken_barh([(ms(c["start"]), max(ms(c["end"]) - ms(c["start"]), 1e-3))], (y - 0.45, 0.4),
                           facecolor=TIMELINE_COLORS["comm"], edgecolor="#6A5ACD", linewidth=0.5)
            if c["blocked_s"] > 0:
                ax.broken_barh([(ms(c["blocked_start"]), 1000 * c["blocked_s"])], (y - 0.45, 0.4),
                               color=TIMELINE_COLORS["exposed"])
        exposed[rank.rank] = exposed_comm_s(rank, steps=steps)
    ax.set_yticks(range(len(lines)), [f"rank {r.rank}" for r in reversed(ranks)])
    ax.set_xlabel("ms")
    shown = ", ".join(f"r{r} {1000 * s:.1f} ms" for r, s in exposed.items())
    ax.set_title(f"compute (top) and communication (bottom) per rank; exposed communication: {shown}",
                 fontsize=9)
    ax.legend(handles=[Patch(color=TIMELINE_COLORS[k], label=k if k != "comm" else "comm in flight")
                       for k in ("forward", "backward", "step", "comm", "exposed")],
              fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.3 / len(lines)), ncol=5)
    ax.figure.tight_layout()
    return ax, exposed
