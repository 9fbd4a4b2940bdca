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
