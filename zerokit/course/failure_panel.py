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
a dropdown picks one, Run runs it with :func:`run_lab`, and the status line and a text
box show the diagnosis; a failed run of the panel itself is shown, not raised.
"""
from __future__ import annotations

import contextlib
import html
import io
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

from .panel import ipywidgets

__all__ = ["Diagnosis", "run_lab", "scrub", "FailurePanel"]

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
    """Run ``fn`` on ``world_size`` ranks through zerokit.launch and read the error it ends with."""
    from ..runtime.errors import RankFailed, RankTimeout
    from ..runtime.launch import launch

    launch_kwargs.setdefault("timeout_s", 10.0)
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


class FailurePanel:
    """A dropdown of failure labs → Run launches the chosen one and shows zerokit's diagnosis of it."""

    def __init__(self, labs: Dict[str, Tuple[Callable, dict]], world_size: int = 2, value: Optional[str] = None):
        if not labs:
            raise ValueError("FailurePanel(labs=…) needs at least one lab: {name: (fn, launch kwargs)}")
        w = ipywidgets()
        self.labs, self.world_size = dict(labs), world_size
        self.choice = w.Dropdown(options=list(self.labs), value=value or next(iter(self.labs)), description="bug")
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.run_button.on_click(lambda _: self.run())
        self.status = w.HTML(value="")
        self.details = w.Textarea(value="", layout=w.Layout(width="100%", height="160px"), disabled=True)
        self.last: Optional[Diagnosis] = None
        self.last_error: Optional[str] = None
        #: how many labs the panel has run (a test reads it)
        self.runs = 0
        self.box = w.VBox([w.HBox([self.choice, self.run_button]), self.status, self.details])

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
        return d

    def __repr__(self) -> str:
        return "FailurePanel: an interactive panel — run this notebook in Jupyter to use it"

    def _repr_mimebundle_(self, **kwargs):
        return self.box._repr_mimebundle_(**kwargs) | {"text/plain": repr(self)}
