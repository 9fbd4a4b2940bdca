"""The tables the lessons show: rows of dicts, as HTML in a notebook and aligned text elsewhere.

:func:`table` shows any rows; :func:`model_state_rows` and :func:`summary_rows` read a
:class:`zerokit.Report` (what the ledgers measured, next to what :mod:`zerokit.theory`
says). Column names say which is which: "measured" was read off the run, "formula" was
computed, and "ring cost" is the ring formula applied to a measured payload — never a count
of the bytes on the wire. Nothing here runs a job or re-types a formula: the numbers come
from the report.
"""
from __future__ import annotations

import html
from typing import Optional, Sequence


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


#: column names of the traffic quantities, saying which are measured and which are formulas
PAYLOAD = "payload B/step (measured)"
RING_COST = "ring cost B/step (formula on measured payload)"
SENT = "sent B/step (measured, ring)"
THEORY = "theory B/step (formula on Ψ)"


def summary_rows(report) -> list:
    """One row per strategy: rank 0's model states and every rank's traffic per step, measured vs formula.

    Traffic columns (the most of any rank): ``PAYLOAD``, the bytes of the tensors the
    collectives were issued on (measured); ``RING_COST``, the ring algorithm's bytes for
    those payloads (a formula on the measured payload, not a count of the wire); ``SENT``,
    the bytes zerokit's ring handed to send (measured; None where the backend ran the
    collectives, so nothing counted its wire); ``THEORY``, :mod:`zerokit.theory`'s formula
    on Ψ and N.
    """
    rows = []
    for result in report.results:
        rank0 = result.ranks[0]
        sent = [r.comm_sent_bytes_per_step for r in result.ranks]
        rows.append({"strategy": result.strategy, "N": result.world_size, "precision": result.precision,
                     "model states B": sum(rank0.model_state_bytes.values()),
                     "theory B": rank0.theory_model_states["total"],
                     PAYLOAD: max(r.comm_payload_bytes_per_step for r in result.ranks),
                     RING_COST: max(r.comm_ring_cost_bytes_per_step for r in result.ranks),
                     SENT: None if any(s is None for s in sent) else max(sent),
                     THEORY: rank0.theory_comm_bytes_per_step,
                     "calls/step": rank0.comm_calls_per_step,
                     "peak B": max(r.peak_bytes for r in result.ranks),
                     "|Δparam| vs single": result.max_abs_param_diff})
    return rows
