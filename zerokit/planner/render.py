"""A plan as text: the per-GPU table with each term's formula and assumption, the traffic, the step time, the advisor.

What ``zerokit plan`` prints and ``str(plan)`` returns. Sizes are in the plan's
convention's unit (GB for ``paper``, GiB for ``deepspeed``); times are estimates and say so.
It names the system the cluster is built of (:mod:`zerokit.theory.systems`) and fits a
terminal: no line longer than :data:`WIDTH` columns but a single unbreakable word; a table
row's last cell (its formula) continues aligned under itself, or under the row when the
columns leave it too little room.
"""
from __future__ import annotations

import re
import textwrap

from .conventions import DIFFERENCE

#: the widest line the text has (a word longer than this stands alone on its line)
WIDTH = 100
#: a table row's last cell is wrapped in place when at least this many columns are left for it
NARROWEST_CELL = 40
#: where a long cell continues when the row leaves it too little room
CELL_INDENT = 8


def _wrap(text: str, first: str, rest: str, width: int = WIDTH) -> list:
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False) or [first.rstrip()]


def _rows(rows: list, widths: tuple) -> list:
    out = []
    for row in rows:
        cells = [str(c) for c in row]
        head = "  " + "".join(c.ljust(w) + "  " for c, w in zip(cells[:-1], widths))
        last = cells[-1]
        if len(head) + len(last) <= WIDTH:
            out.append((head + last).rstrip())
        elif WIDTH - len(head) >= NARROWEST_CELL:
            out += _wrap(last, head, " " * len(head))
        else:
            out.append(head.rstrip())
            out += _wrap(last, " " * CELL_INDENT, " " * CELL_INDENT)
    return out


_MARKER = re.compile(r"(- |\d+\. )")


def fit(lines: list, width: int = WIDTH) -> list:
    """Every line within ``width`` columns: a long one wrapped at spaces, continuing under its text (after a list
    marker, "- " or "3. ") or four columns in."""
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        body = line.lstrip()
        lead = " " * (len(line) - len(body))
        marker = _MARKER.match(body)
        rest = lead + (" " * len(marker.group(0)) if marker else "    ")
        out += _wrap(body, lead, rest, width)
    return out


def seconds(x: float) -> str:
    """3 significant figures in s, ms or µs."""
    if x >= 1:
        return f"{x:.3g} s"
    if x >= 1e-3:
        return f"{x * 1e3:.3g} ms"
    return f"{x * 1e6:.3g} µs"


def memory_lines(plan) -> list:
    u, m, layout = plan.convention, plan.memory, plan.layout
    where = f" — pipeline stage {m.stage} of {layout.pp}, the fullest" if layout.pp > 1 else ""
    lines = [f"per GPU{where} ({u.unit_name}; Ψ on this rank = {m.psi_rank:,}):"]
    rows = [(t.category, t.name, u.text(t.bytes), t.formula + (f" — {t.assumption}" if t.assumption else ""))
            for t in m.terms if t.category != "host"]
    s = m.model_states
    rows.insert(3, ("", "model states", u.text(s.total), "params + grads + optimizer"))
    verdict = "fits" if plan.fits else f"does NOT fit (over by {u.text(m.total - plan.cluster.gpu_memory)})" \
        if m.total > plan.cluster.gpu_memory else "does NOT fit (host memory)"
    if not plan.model.has_shape:
        verdict += " (model states and buffers only: activations not counted)"
    rows.append(("", "total", u.text(m.total), f"of {u.text(plan.cluster.gpu_memory)}: {verdict}"))
    lines += _rows(rows, (11, 40, 10, 0))
    host = [t for t in m.terms if t.category == "host"]
    if host or plan.host_bytes_per_node:
        lines.append(f"  host memory per node: {u.text(plan.host_bytes_per_node)} ({plan.host_formula})"
                     + (f"; per GPU {host[0].formula}" if host else ""))
    return lines


def traffic_lines(plan) -> list:
    u = plan.convention
    lines = ["traffic per step per GPU — time is an estimate (α-β on each axis's link, ring rounds as "
             "messages, nothing overlapped with compute):"]
    if not plan.transfers:
        lines.append("  none (one GPU, nothing offloaded)")
    rows = [(t.axis, t.collective, u.text(t.bytes), f"{t.calls:g} calls", t.link, f"≈ {seconds(t.seconds)}",
             t.formula) for t in plan.transfers]
    lines += _rows(rows, (5, 30, 10, 12, 11, 11, 0))
    if plan.transfers:
        per_axis = ", ".join(f"{axis} {u.text(b)}" for axis, b in plan.comm_bytes_per_step.items())
        lines.append(f"  total: {per_axis}; ≈ {seconds(plan.comm_seconds)} per step on the links (estimate)")
        per_link = ", ".join(f"{link} {u.text(b)}" for link, b in plan.comm_bytes_by_link.items())
        lines.append(f"  by link: {per_link}; {u.text(plan.bytes_leaving_node)} leave each node per step")
    b = plan.bubble
    if b["p"] > 1:
        lines.append(f"pipeline bubble: {100 * b['fraction_of_wall_time']:.1f} % of wall time "
                     f"({100 * b['over_ideal']:.1f} % over ideal), {b['formula']}, p = {b['p']}, m = {b['m']}")
    return lines


def step_time_lines(plan) -> list:
    """The estimated step: compute, bubble, each axis's traffic and its exposed part, step, tokens/s, MFU."""
    est = plan.step_time
    if est is None:
        return ["step time — estimated: needs a shape (layers, sequence) to count FLOPs; give a preset or a shape"]
    lines = [f"step time — estimated, not measured ({est.assumptions[0]}; overlap {est.overlap}):"]
    rows = [("compute", f"≈ {seconds(est.compute_seconds)}",
             f"{est.hardware_flops_per_step:.3g} FLOPs (recomputation: {est.recompute}) over {est.gpus} GPUs")]
    rows += [(f"{a.axis} traffic", f"≈ {seconds(a.seconds)}", f"exposed ≈ {seconds(a.exposed_seconds)}: {a.rule}")
             for a in est.axes]
    if est.bubble_over_ideal:
        rows.append(("bubble", f"≈ {seconds(est.bubble_seconds)}",
                     f"(p − 1)/(v·m) = {est.bubble_over_ideal:.3g} of the pipelined work"))
    rows.append(("step", f"≈ {seconds(est.step_seconds)}",
                 f"{est.tokens_per_second:,.0f} tokens/s estimated ({est.tokens_per_step:,} tokens per step)"))
    rows.append(("MFU", f"≈ {100 * est.mfu:.1f} %", f"model FLOPs (6Ψ + attention) over step × GPUs × peak; "
                                                  f"HFU ≈ {100 * est.hfu:.1f} %, "
                                                  f"{est.achieved_flops_per_gpu / 1e12:.3g} TFLOP/s per GPU"))
    lines += _rows(rows, (14, 11, 0))
    lines += [f"  assumed: {a}" for a in est.assumptions[1:]]
    return lines


def render(plan, advice: bool = True) -> str:
    lines = [f"zerokit plan — {plan.model.describe()}",
             f"cluster: {plan.cluster.describe(plan.convention)}",
             f"system: {plan.cluster.describe_system()}",
             f"layout: {plan.layout.describe()}",
             f"convention: {plan.convention.name} — {plan.convention.summary}", ""]
    lines += memory_lines(plan) + [""] + traffic_lines(plan) + [""] + step_time_lines(plan)
    if advice:
        lines += [""] + plan.advise().lines()
    notes = list(plan.notes) + [f"assumed links: {'; '.join(plan.cluster.assumptions)}", DIFFERENCE]
    lines += ["", "notes:"] + [f"  - {n}" for n in notes]
    return "\n".join(fit(lines))
