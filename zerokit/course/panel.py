"""The base every interactive panel shares: Run button, progress bar, status line, picture, details.

A panel is an ipywidgets box that runs real, small jobs through :func:`zerokit.train`
(so through :func:`zerokit.launch`) whenever a control changes or Run is clicked, and
shows what the ledgers measured as a picture, next to :mod:`zerokit.theory`.
:class:`Panel` runs a panel's ``(strategy, world_size, kwargs)`` jobs one by one,
advancing the progress bar, keeps the :class:`zerokit.Report` in ``last_report`` and
calls the panel's ``draw``; a job that fails is shown in the status line (and
``last_error``), not raised from a callback nobody sees.

Panels draw into an ``ipywidgets.Image`` and print nothing, so no text leaks into a
cell's output under nbval (FACTS §9). Displayed, a panel offers the widget view *and* a
static ``image/png`` of its last picture with a ``text/plain`` line (:func:`mimebundle`):
a saved notebook read without a kernel (GitHub, nbviewer) still shows what the panel drew. Their callbacks are plain methods: a test sets a
control's ``value`` or calls ``run_button.click()`` and reads ``last_report``.
"""
from __future__ import annotations

import base64
import html
import time
from typing import Optional, Sequence

from ..report import Report
from ..train import train


def ipywidgets():
    """The ipywidgets module, imported only when a panel is built (the rest of the course runs without it)."""
    import ipywidgets as module

    return module


def mimebundle(panel, **kwargs) -> dict:
    """The widget view of ``panel.box``, its ``text/plain`` repr and, once drawn, a PNG of ``panel.image``.

    The PNG is the picture the panel last drew (base64, as the notebook format stores it);
    a front end with a live kernel shows the widget, any other the picture.
    """
    bundle = dict(panel.box._repr_mimebundle_(**kwargs) or {})
    bundle["text/plain"] = repr(panel)
    if panel.image.value:
        bundle["image/png"] = base64.b64encode(bytes(panel.image.value)).decode("ascii")
    return bundle


class Panel:
    """What every panel shares: a Run button, progress, status, the picture, and running jobs one by one."""

    def _build_common(self):
        w = ipywidgets()
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

    def _world_size_and_precision(self, world_sizes, world_size, precisions, precision) -> None:
        """The world-size slider (2 by default where offered) and the precision buttons two panels share."""
        w = ipywidgets()
        if world_size is None:
            world_size = 2 if 2 in world_sizes else world_sizes[0]
        self.world_size = w.SelectionSlider(options=list(world_sizes), value=world_size, description="world size",
                                            continuous_update=False)
        self.precision = w.ToggleButtons(options=list(precisions), value=precision or precisions[0],
                                         description="precision")

    def _changed(self, change) -> None:
        """A control changed: run again when the panel runs on every change (``auto_run``)."""
        if self.auto_run:
            self.run()

    def _fail(self, message: str) -> None:
        """Show why a run failed in the status line and keep it in ``last_error``; returns None."""
        self.last_error = message
        self.status.value = f"<span style='color:#C44E52'>{html.escape(message)}</span>"
        return None

    def _train_all(self, jobs: Sequence[tuple]) -> Optional[object]:
        """Run ``(strategy, world_size, kwargs)`` jobs through zerokit.train, advancing the progress bar."""
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
            return self._fail(f"{type(exc).__name__}: {exc}")
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
        return mimebundle(self, **kwargs)
