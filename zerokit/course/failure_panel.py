"""Failure labs: run a buggy job for real, catch zerokit's error, and read it — which rank, which op, phase, call.

Lifecycle of :func:`run_lab`: launch the lab's function on its ranks through
:func:`zerokit.launch` (short timeout, optional heartbeat or collective check), with the
ranks' own output captured rather than printed (it holds stack dumps); catch
:class:`~zerokit.RankFailed` or :class:`~zerokit.RankTimeout`; return a
:class:`Diagnosis`: the error's kind, the rank it blames, the op, call number and phase
it names for that rank (read from the error's text, which comes from the ranks' status
slots and the collective check), the seconds until the error, and the message itself
with loopback ports and file paths taken out (:func:`scrub`).

:class:`FailurePanel` holds the labs a notebook defines (``{name: (fn, launch kwargs)}``):
a dropdown picks one, Run runs it with :func:`run_lab` (the first one runs at
construction), and the status line, a picture (:func:`diagnosis_figure`: one row per
rank, where it was, the blamed rank outlined) and a text box show the diagnosis; a
failed run of the panel itself is shown, not raised.
"""
from __future__ import annotations

import contextlib
import html
import io
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

from ..runtime.errors import RankFailed, RankTimeout
from ..runtime.launch import launch
from .figures import new_figure, png
from .panel import ipywidgets, mimebundle

__all__ = ["Diagnosis", "run_lab", "scrub", "FailurePanel", "diagnosis_figure"]

_PORT = re.compile(r"\[?127\.0\.0\.1\]?:\d+")
_PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+(?=[\w.+-]+\.(?:py|cc|cpp|h)\b)")
_ADDRESS = re.compile(r"0x[0-9a-f]{6,}")


def scrub(text: str) -> str:
    """The text without what belongs to one machine or run: loopback ports, directories of files, addresses."""
    return _ADDRESS.sub("0x…", _PATH.sub("…/", _PORT.sub("[loopback]", text)))


@dataclass
class Diagnosis:
    """What a lab's run ended with, read off zerokit's error."""

    lab: str
    #: the exception zerokit raised ("RankFailed", "RankTimeout"), or "" when the run finished
    error: str
    #: the rank the error blames (RankFailed), or the ranks still running (RankTimeout)
    ranks: Tuple[int, ...]
    #: the exception inside the blamed rank ("CollectiveMismatch", "ValueError"), or "exit" / "" (timeout)
    cause: str
    #: the collective named for the first blamed rank, its call number and phase ("" / 0 when none)
    op: str
    call: int
    phase: str
    #: measured: seconds from the launch to the error
    seconds: float
    #: the last line of the blamed rank's traceback (or the timeout's sentence), scrubbed
    summary: str
    #: where every rank was, as the error says, scrubbed
    where: str
    #: the whole message, scrubbed
    message: str = field(repr=False, default="")
    #: what the ranks printed (stack dumps included), scrubbed
    output: str = field(repr=False, default="")

    def per_rank(self) -> Dict[int, str]:
        """``where`` cut back into one sentence part per rank ({1: "is dead; it was in all_reduce #7 …"})."""
        parts: Dict[int, str] = {}
        for clause in re.split(r"; (?=ranks? \d)|\. (?=ranks? \d+ returned)", self.where):
            found = re.match(r"ranks? ([\d, ]+?) (?:is|are) (.*)", clause)
            if found:
                for rank in found.group(1).split(","):
                    parts[int(rank)] = found.group(2)
        return parts

    def reading(self) -> str:
        """The diagnosis in a few lines: error, rank, op/call/phase, cause, where the others were."""
        if not self.error:
            return f"{self.lab}: finished without an error in {self.seconds:.1f} s"
        at = f"{self.op} #{self.call} of {self.phase}" if self.op else "no collective named"
        lines = [f"{self.lab}: {self.error} after {self.seconds:.1f} s, blaming rank(s) {list(self.ranks)}",
                 f"  at: {at}", f"  cause: {self.summary}"]
        if self.where:
            lines.append(f"  where the ranks were: {self.where}")
        return "\n".join(lines)


def _named(text: str, rank: int) -> Tuple[str, int, str]:
    """The op, call number and phase the text names for ``rank`` (first match), else ("", 0, "")."""
    patterns = (rf"rank {rank} is (?:dead; it was )?(?:in|waiting for async) (?:ring )?(\w+) #(\d+) of (\w+)",
                rf"rank {rank} is in (\w+) of \d+ \w+ \(#(\d+) of (\w+)\)",
                rf"rank {rank} exited [^\n]*?, in (\w+) #(\d+) of (\w+)",
                rf"ranks? [\d, ]*\b{rank}\b[\d, ]* (?:is|are) (?:in|waiting for async) (\w+) #(\d+) of (\w+)")
    for pattern in patterns:
        found = re.search(pattern, text)
        if found:
            return found.group(1), int(found.group(2)), found.group(3)
    return "", 0, ""


def run_lab(name: str, fn: Callable, world_size: int = 2, **launch_kwargs) -> Diagnosis:
    """Run ``fn`` on ``world_size`` ranks through zerokit.launch (gloo unless ``backend=`` says otherwise) and read
    the error it ends with."""
    launch_kwargs.setdefault("timeout_s", 10.0)
    launch_kwargs.setdefault("backend", "gloo")  # the labs are gloo's failures, on CPU ranks on any machine
    captured = io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            launch(fn, world_size, **launch_kwargs)
    except RankFailed as e:
        seconds = time.perf_counter() - start
        lines = [line for line in e.traceback.strip().splitlines() if line.strip()]
        last = lines[-1].strip() if lines else ""
        cause = last.split(":")[0] if e.traceback.lstrip().startswith("Traceback") else "exit"
        op, call, phase = _named(e.traceback + "\n" + e.where, e.rank)
        return Diagnosis(name, "RankFailed", (e.rank,), cause.rsplit(".", 1)[-1], op, call, phase, seconds,
                         scrub(last), scrub(e.where), scrub(str(e)), scrub(captured.getvalue()))
    except RankTimeout as e:
        seconds = time.perf_counter() - start
        first = _named(e.where, e.ranks[0]) if e.ranks else ("", 0, "")
        return Diagnosis(name, "RankTimeout", tuple(e.ranks), "", *first, seconds, scrub(str(e).split(", with")[0]),
                         scrub(e.where), scrub(str(e)), scrub(captured.getvalue()))
    return Diagnosis(name, "", (), "", "", 0, "", time.perf_counter() - start, "", "", "", scrub(captured.getvalue()))


_COLORS = {"finished": "#55A868", "dead": "#C44E52", "waiting": "#DD8452", "in": "#DD8452", "not": "#8C8C8C"}


def diagnosis_figure(d: Diagnosis):
    """One row per rank: where it was when the launch failed, coloured by state, the blamed rank outlined."""
    from matplotlib.patches import Patch

    parts = d.per_rank()
    ranks = sorted(parts) or list(d.ranks)
    fig, ax = new_figure(10, 1.3 + 0.55 * max(1, len(ranks)))
    for row, rank in enumerate(ranks):
        part = parts.get(rank, "")
        color = _COLORS.get(part.split(" ")[0].rstrip(";"), "#4C72B0")
        blamed = rank in d.ranks
        ax.barh(row, 1, color=color, alpha=0.35, edgecolor="#222222" if blamed else color, linewidth=2 if blamed else 1)
        label = (f"rank {rank}" + (" (blamed)" if blamed else "") + f": {part}")
        ax.text(0.01, row, label if len(label) < 100 else label[:97] + "…", va="center", fontsize=11)
    ax.set_yticks([])
    ax.set_xticks([])
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    states = {_COLORS.get(parts.get(r, "").split(" ")[0].rstrip(";"), "#4C72B0") for r in ranks}
    keys = [(c, label) for c, label in (("#55A868", "finished"), ("#C44E52", "dead"),
                                        ("#DD8452", "in a call"), ("#8C8C8C", "not in a call"),
                                        ("#4C72B0", "elsewhere")) if c in states]
    if keys:  # what each row's colour says
        ax.legend(handles=[Patch(facecolor=c, alpha=0.35, label=label) for c, label in keys], loc="upper center",
                  bbox_to_anchor=(0.5, 0.0), ncol=len(keys), frameon=False, fontsize=10)
    ax.set_title(f"{d.lab}: {d.error or 'no error'} after {d.seconds:.1f} s (measured)"
                 + (f" — {d.cause}" if d.cause else ""), fontsize=11)
    fig.tight_layout()
    return fig


class FailurePanel:
    """A dropdown of failure labs → Run launches the chosen one and shows zerokit's diagnosis of it."""

    def __init__(self, labs: Dict[str, Tuple[Callable, dict]], world_size: int = 2, value: Optional[str] = None,
                 run: bool = True):
        if not labs:
            raise ValueError("FailurePanel(labs=…) needs at least one lab: {name: (fn, launch kwargs)}")
        w = ipywidgets()
        self.labs, self.world_size = dict(labs), world_size
        self.choice = w.Dropdown(options=list(self.labs), value=value or next(iter(self.labs)), description="bug")
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.run_button.on_click(lambda _: self.run())
        self.status = w.HTML(value="")
        self.details = w.Textarea(value="", layout=w.Layout(width="100%", height="160px"), disabled=True)
        self.image = w.Image(format="png")
        self.last: Optional[Diagnosis] = None
        self.last_error: Optional[str] = None
        #: how many labs the panel has run (a test reads it)
        self.runs = 0
        self.box = w.VBox([w.HBox([self.choice, self.run_button]), self.status, self.image, self.details])
        if run:
            self.run()

    def run(self) -> Optional[Diagnosis]:
        """Run the chosen lab and show its diagnosis."""
        name = self.choice.value
        fn, kwargs = self.labs[name]
        self.run_button.disabled = True
        self.status.value = f"running <b>{html.escape(name)}</b> on {self.world_size} ranks…"
        try:
            self.last = run_lab(name, fn, self.world_size, **kwargs)
        except Exception as exc:  # shown in the panel: a callback's exception would go to a log nobody reads
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.status.value = f"<span style='color:#C44E52'>{html.escape(self.last_error)}</span>"
            return None
        finally:
            self.run_button.disabled = False
        self.last_error, self.runs = None, self.runs + 1
        d = self.last
        blamed = f"rank(s) {list(d.ranks)}" if d.error else "nothing"
        at = f", at {d.op} #{d.call} of {d.phase}" if d.op else ""
        self.status.value = (f"<b>{html.escape(d.error or 'no error')}</b> after {d.seconds:.1f} s, blaming "
                             f"{blamed}{html.escape(at)}" + (f" — {html.escape(d.cause)}" if d.cause else ""))
        self.details.value = d.reading()
        self.image.value = png(diagnosis_figure(d))
        return d

    def __repr__(self) -> str:
        return "FailurePanel: an interactive panel — run this notebook in Jupyter to use it"

    def _repr_mimebundle_(self, **kwargs):
        return mimebundle(self, **kwargs)
