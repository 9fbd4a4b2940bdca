"""The ring: its rounds as a grid, and a panel that runs a ring collective and counts the bytes.

:func:`ring_schedule_figure` draws :func:`zerokit.ring.ring_schedule` (which chunk each
rank sends in each round); it runs nothing. :class:`CollectivePanel` runs one ring
collective of the chosen size on the chosen number of ranks through
:func:`zerokit.launch` whenever a control changes, and puts the rounds and the bytes each
rank handed to send/recv — the ledger's ``sent_bytes``, measured on the wire because
zerokit's ring ran the collective — next to the ring formula
:func:`zerokit.theory.ring_bytes_sent`.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

from .. import theory
from ..runtime import comm, ring
from ..runtime.launch import launch
from ..runtime.ring import ring_phase, ring_schedule
from .figures import LABEL_SIZE, legend_outside, LEGEND_SIZE, new_figure, png, TITLE_SIZE
from .panel import ipywidgets, Panel
from .tables import table


#: the colour of each half of a ring collective in :func:`ring_schedule_figure`, and its key
PHASE_COLORS = {"reduce_scatter": "#DD8452", "all_gather": "#55A868"}
PHASE_KEYS = {"reduce_scatter": "reduce-scatter\n(add, pass on)", "all_gather": "all-gather\n(pass the sum on)"}


def ring_schedule_figure(n: int, op: str = "all_reduce", ax=None):
    """The ring's rounds as a grid: one row per rank, one column per round, the chunk each rank sends.

    Drawn from :func:`zerokit.ring.ring_schedule`: reduce-scatter rounds in orange,
    all-gather rounds in green, said by the key under the grid; "c2 → r1" means "sends
    chunk 2 to rank 1". Returns the figure (a new one unless ``ax`` is given).
    """
    from matplotlib.patches import Patch

    rounds = len(ring_schedule(op, n, 0))
    own = ax is None
    if own:
        fig, ax = new_figure(max(6.0, 3.4 + 0.9 * rounds), 1.2 + 0.5 * max(n, 3))
    for rank in range(n):
        y = n - 1 - rank
        for step in ring_schedule(op, n, rank):
            ax.add_patch(_rectangle(step.round, y, PHASE_COLORS[ring_phase(op, n, step.round)]))
            ax.text(step.round + 0.5, y + 0.5, f"c{step.send_chunk} → r{(rank + 1) % n}", ha="center",
                    va="center", fontsize=LEGEND_SIZE if rounds > 8 else LABEL_SIZE)
    ax.set_xlim(0, rounds)
    ax.set_ylim(0, n)
    ax.set_xticks([k + 0.5 for k in range(rounds)], [str(k + 1) for k in range(rounds)], fontsize=LABEL_SIZE)
    ax.set_yticks([n - 1 - r + 0.5 for r in range(n)], [f"rank {r}" for r in range(n)], fontsize=LABEL_SIZE)
    ax.set_xlabel("round", fontsize=LABEL_SIZE)
    phases = [p for p in PHASE_COLORS if any(ring_phase(op, n, k) == p for k in range(rounds))]
    ax.set_title(f"ring {op.replace('_', '-')} on {n} ranks: {rounds} rounds", fontsize=TITLE_SIZE)
    legend_outside(ax, handles=[Patch(color=PHASE_COLORS[p], alpha=0.6, label=PHASE_KEYS[p]) for p in phases],
                   labelspacing=0.8)
    if own:
        ax.figure.tight_layout()
    return ax.figure


def _rectangle(x, y, color):
    from matplotlib.patches import Rectangle

    return Rectangle((x + 0.04, y + 0.08), 0.92, 0.84, color=color, alpha=0.6)


def _ring_collective(ctx, op: str, numel: int) -> dict:
    """On each rank: one ring ``op`` of ``numel`` fp32 elements; its rounds, bytes and seconds.

    ``payload_bytes`` (measured: the tensor), ``sent_bytes`` (measured: what the ring handed
    to send) and ``ring_cost_bytes`` (the ring formula on the payload), from the ledger.
    """
    import torch
    import torch.distributed as dist

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
            "sent_bytes": record.sent_bytes, "ring_cost_bytes": record.ring_cost_bytes, "seconds": seconds}


class CollectivePanel(Panel):
    """Collective × world size × payload → the ring's rounds, and the bytes each rank really sent.

    Runs :mod:`zerokit.ring` on send/recv through :func:`zerokit.launch`, so the bytes are
    counted as they are sent (``sent_bytes``, measured); the picture puts them next to the
    ring formula :func:`zerokit.theory.ring_bytes_sent`. The trade-off it shows: more ranks mean more
    rounds (latency), while the bytes per rank stay under 2× the payload (bandwidth).
    """

    def __init__(self, ops: Sequence[str] = ("all_reduce", "reduce_scatter", "all_gather"),
                 world_sizes: Sequence[int] = (2, 3, 4, 6, 8), payload_kib: Sequence[int] = (4, 64, 1024),
                 world_size: int = 4, auto_run: bool = True, run: bool = True):
        w = ipywidgets()
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

    def run(self):
        op, n = self.op.value, self.world_size.value
        numel = max(n, (self.payload_kib.value * 1024 // 4) // n * n)
        self.progress.max, self.progress.value = 1, 0
        self.status.value = f"running a ring {op} on {n} ranks…"
        start = time.perf_counter()
        try:
            result = launch(_ring_collective, n, op, numel)
        except Exception as exc:  # shown in the panel rather than lost in a callback
            return self._fail(f"{type(exc).__name__}: {exc}")
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
        # the rounds on top, the bytes under them: side by side, 8 ranks' 14 rounds would not fit a screen
        fig, _ = new_figure(max(6.5, min(14.0, 3.4 + 0.8 * rounds)), 3.6 + 0.42 * max(n, 3))
        fig.clear()
        left, right = fig.subplots(2, 1, height_ratios=[max(n, 3), 3.2])
        ring_schedule_figure(n, op, ax=left)
        payload = result[0]["payload_bytes"]
        expected = theory.ring_bytes_sent(op, payload, n)
        right.bar(range(n), [r["sent_bytes"] / 1024 for r in result], color="#4C72B0", label="sent (measured, ring)")
        right.plot([-0.4, n - 0.6], [expected / 1024] * 2, color="black", lw=2, label="ring formula")
        right.plot([-0.4, n - 0.6], [payload / 1024] * 2, color="#999999", lw=1, ls="--", label="payload S")
        right.set_xticks(range(n), [f"r{r}" for r in range(n)], fontsize=LABEL_SIZE)
        right.set_ylabel("KiB per rank", fontsize=LABEL_SIZE)
        right.set_title("bytes each rank sent", fontsize=TITLE_SIZE)
        right.set_ylim(0, 1.15 * max(expected, payload, *(r["sent_bytes"] for r in result)) / 1024)
        legend_outside(right)
        fig.tight_layout()
        self.image.value = png(fig)
        rows = [{"rank": r["rank"], "rounds": r["rounds"], "theory rounds": _rounds(op, n),
                 "payload B (measured)": r["payload_bytes"], "sent B (measured, ring)": r["sent_bytes"],
                 "ring formula B": expected, "ms": round(1e3 * r["seconds"], 2)}
                for r in result]
        self.details.value = table(rows)._repr_html_()


def _rounds(op: str, n: int) -> int:
    return theory.ring_steps(op, n)
