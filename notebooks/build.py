"""Build the course notebooks from their sources and run them from a clean kernel.

Each lesson is written as a plain Python file in ``notebooks/src/`` (cells separated by
``# %%`` lines, markdown cells by ``# %% [markdown]`` with every line commented), so a
review reads as a diff of code and prose. This script turns each source into
``notebooks/NN_name.ipynb``, executes it top to bottom in a fresh kernel with the
notebook folder as working directory, and writes it back with its real outputs, cleaned
of what a reader's machine would differ in (timestamps, widget state; see ``clean``).

    python notebooks/build.py            # every lesson
    python notebooks/build.py 03 05      # the lessons whose names start with 03 or 05
    python notebooks/build.py --no-run   # sources to notebooks only, no outputs

A cell opened with ``# %% [checks]`` holds the assertions that keep a lesson's figures
honest (measured against the formula, the run against the single process): it runs like
any other cell, but the notebook shows it collapsed, the teaching cells in front.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
#: seconds one cell may take (the longest cell of the course takes a few seconds)
CELL_TIMEOUT_S = 120
#: the output a widget shows only in a live kernel; a committed notebook keeps its other forms — a panel's
#: text/plain line and the image/png of its last picture (zerokit.course.panel.mimebundle), which GitHub and
#: nbviewer show without a kernel
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def parse_cells(text: str) -> list:
    """Split a percent-format source into (kind, source) pairs; kind ``checks`` is a code cell (``# %% [checks]``)
    that keeps the figures honest — it runs under nbval like any other, but the notebook shows it collapsed."""
    cells, kind, lines = [], None, []

    def flush():
        if kind is not None:
            body = "\n".join(lines).strip("\n")
            if kind == "markdown":
                body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                                 for line in body.splitlines())
            cells.append((kind, body))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind = "markdown" if "[markdown]" in line else "checks" if "[checks]" in line else "code"
            lines = []
        elif kind is not None:
            lines.append(line)
    flush()
    return cells


def notebook_from_source(path: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    for i, (kind, body) in enumerate(parse_cells(path.read_text())):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cell = make(body)
        cell["id"] = f"c{i:02d}"
        if kind == "checks":  # JupyterLab and VS Code show it folded; nbval runs it
            cell.metadata["jupyter"] = {"source_hidden": True}
            cell.metadata["tags"] = ["checks"]
        nb.cells.append(cell)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    return nb


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what differs between machines and runs: execution timestamps, widget state and views (a panel's PNG stays)."""
    nb.metadata.pop("widgets", None)
    nb.metadata["language_info"] = {"name": "python"}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell["outputs"] = merge_streams(cell.get("outputs", [])) if cell.cell_type == "code" else cell.get("outputs")
        if cell.cell_type != "code":
            cell.pop("outputs", None)
        for output in cell.get("outputs", []):
            data = output.get("data")
            if data is not None and WIDGET_VIEW in data:
                del data[WIDGET_VIEW]
            output.get("metadata", {}).pop("execution", None)
    return nb


def merge_streams(outputs: list) -> list:
    """Join consecutive stream outputs of the same stream (nbclient keeps one per message)."""
    merged = []
    for output in outputs:
        if (merged and output.get("output_type") == "stream" and merged[-1].get("output_type") == "stream"
                and merged[-1].get("name") == output.get("name")):
            merged[-1]["text"] += output["text"]
        else:
            merged.append(output)
    return merged


def build(path: Path, run: bool = True) -> float:
    nb = notebook_from_source(path)
    target = HERE / (path.stem + ".ipynb")
    elapsed = 0.0
    if run:
        client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", store_widget_state=False,
                                resources={"metadata": {"path": str(HERE)}})
        start = time.perf_counter()
        client.execute()
        elapsed = time.perf_counter() - start
        clean(nb)
    nbformat.write(nb, target)
    return elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="build only the lessons whose names start with these")
    parser.add_argument("--no-run", action="store_true", help="write the notebooks without executing them")
    args = parser.parse_args(argv)
    sources = sorted(p for p in SOURCES.glob("*.py")
                     if not args.prefixes or any(p.name.startswith(x) for x in args.prefixes))
    if not sources:
        print(f"no lesson matches {args.prefixes}", file=sys.stderr)
        return 2
    for path in sources:
        elapsed = build(path, run=not args.no_run)
        print(f"{path.stem + '.ipynb':<32} {elapsed:6.1f} s" if not args.no_run else path.stem + ".ipynb")
    return 0


if __name__ == "__main__":
    sys.exit(main())
