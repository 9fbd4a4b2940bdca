"""Load a learner's code: a notebook's code cells, a ``.py`` file, a module, or a live namespace.

Lifecycle: :func:`load` turns a submission into the namespace the checks read names from.
A notebook's code cells run in order, each compiled under the name ``<NAME cell K>`` and
registered with :mod:`linecache`, so a traceback points at the learner's cell and line;
IPython magics (``%…``, ``!…``) are skipped. The code runs with ``__name__`` set to
``zerokit_submission``: the cells of an exercise that demo or grade
(``if __name__ == "__main__":``) do not run, and a ``zerokit.grade`` call that runs anyway
returns at once instead of grading again. Loading is bounded by a timeout (``LOAD_TIMEOUT_S``, or
the grading's ``timeout_s``). Anything that goes wrong — a cell that raises, a stray
``sys.exit()`` (a notebook stops there too), a syntax error, the time limit — becomes a
:class:`LoadError` with a learner's message; ``timed_out`` tells the last apart.
"""
from __future__ import annotations

import json
import linecache
import re
import signal
import threading
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Tuple

from .core import learner_frame

MODULE_NAME = "zerokit_submission"
LOAD_TIMEOUT_S = 60
SUFFIXES = (".ipynb", ".py")

#: set while a submission's code is being loaded
loading = threading.local()


class LoadError(Exception):
    """The submission could not be loaded; the message says where and why. ``timed_out``: it ran past the limit."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


def is_loading() -> bool:
    return getattr(loading, "active", False)


def notebook_cells(path: Path) -> list:
    """The source of every code cell of a notebook, in order."""
    try:
        nb = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise LoadError(f"{path.name} is not a readable notebook ({e})") from e
    cells = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            source = cell.get("source", "")
            cells.append("".join(source) if isinstance(source, list) else source)
    return cells


def _strip_magics(source: str) -> str:
    return "\n".join("pass  # " + line if re.match(r"^\s*[%!]", line) else line for line in source.splitlines())


def too_long(seconds: float) -> str:
    """What a load that ran past ``seconds`` is told."""
    return (f"loading took longer than {seconds:g} s: does a cell run something long outside "
            f"`if __name__ == \"__main__\":`?")


@contextmanager
def _deadline(seconds: float):
    """Raise LoadError if the block runs longer than ``seconds`` (main thread only; elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise LoadError(too_long(seconds), timed_out=True)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _run_source(source: str, filename: str, ns: dict, label: str) -> None:
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as e:
        raise LoadError(f"{label} has a syntax error at line {e.lineno}: {e.msg}"
                        + (f": {e.text.strip()}" if e.text else "")) from e
    try:
        exec(code, ns)
    except LoadError:
        raise
    except SystemExit as e:  # sys.exit() in a cell: a notebook run top to bottom stops there
        raise LoadError(f"{label} called sys.exit({'' if e.code is None else repr(e.code)}): a notebook run top "
                        f"to bottom stops there — remove it") from e
    except Exception as e:  # noqa: BLE001 - the learner's code raised while loading: say where
        import traceback

        where = learner_frame("".join(traceback.format_exception(e)))
        raise LoadError(f"{label} raised {type(e).__name__}: {e}" + (f" in {where}" if where else "")) from e


def load_path(path: Path, timeout_s: Optional[float] = None) -> dict:
    """Run a notebook's code cells, or a .py file, in a fresh namespace and return it, within ``timeout_s``
    seconds (None: ``LOAD_TIMEOUT_S``)."""
    if not path.is_file():
        raise LoadError(f"no such file: {path}")
    if path.suffix not in SUFFIXES:
        raise LoadError(f"{path.name}: expected a notebook (.ipynb) or a Python file (.py)")
    ns: dict = {"__name__": MODULE_NAME, "__file__": str(path), "__builtins__": __builtins__}
    loading.active = True
    try:
        with _deadline(timeout_s or LOAD_TIMEOUT_S):
            if path.suffix == ".ipynb":
                for k, source in enumerate(notebook_cells(path), start=1):
                    _run_source(_strip_magics(source), f"<{path.stem} cell {k}>", ns, f"code cell {k}")
            else:
                _run_source(path.read_text(), str(path), ns, path.name)
    finally:
        loading.active = False
    return ns


def load(submission) -> Tuple[dict, str]:
    """``(namespace, label)`` for a path, a module or a namespace dict."""
    if isinstance(submission, dict):
        return submission, "this notebook" if "get_ipython" in submission or "In" in submission else "namespace"
    if isinstance(submission, types.ModuleType):
        return vars(submission), f"module {submission.__name__}"
    if isinstance(submission, (str, Path)):
        path = Path(submission)
        return load_path(path), str(submission)
    raise TypeError(f"grade: expected a path to a notebook or .py file, a module or a namespace (globals()), "
                    f"got {type(submission).__name__}")


def exercise_key(submission, ns: Optional[dict]) -> Optional[str]:
    """The exercise a submission answers: its ``EXERCISE`` variable, else the number its file name starts with."""
    if ns and isinstance(ns.get("EXERCISE"), str):
        return ns["EXERCISE"]
    if isinstance(submission, (str, Path)):
        match = re.match(r"(\d\d)", Path(submission).name)
        if match:
            return match.group(1)
    return None
