"""Reading a committed lesson as a reader without a kernel sees it: its cells, its markdown, what a cell printed.

Shared by the course-reading tests; nothing here re-runs a lesson."""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


def _cells(name: str) -> list:
    return json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())["cells"]


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _markdown(name: str) -> str:
    """Every markdown cell of a lesson, its line breaks folded to spaces (a phrase may wrap)."""
    return " ".join(" ".join(_source(c).split()) for c in _cells(name) if c["cell_type"] == "markdown")


def _printed(cell) -> str:
    """What a code cell showed a reader: its streams, plain text, markdown and HTML."""
    out = []
    for output in cell.get("outputs", []):
        if "text" in output:
            out.append("".join(output["text"]) if isinstance(output["text"], list) else output["text"])
        for mime in ("text/plain", "text/markdown", "text/html"):
            value = output.get("data", {}).get(mime)
            if value is not None:
                out.append("".join(value) if isinstance(value, list) else value)
    return "\n".join(out)
