"""What a lesson computes to show is shown: every table and figure a cell makes reaches the page.

A notebook displays a cell's *last* expression and nothing else: a ``course.table(...)``
in the middle of a cell, or a figure (``course.new_figure`` and the ``*_figure`` /
``*_bars`` helpers make plain matplotlib figures, never registered with pyplot) that the
cell does not end on, is computed and thrown away while the prose under it points at
"the table above". Two checks, one on the sources and one on the committed outputs:

- every ``course.table(...)`` is the cell's last expression or the argument of
  ``display(...)``, and a cell that makes a figure ends on an expression or displays it;
- every code cell of a committed notebook that makes a table or a figure unconditionally
  (at its top level, outside ``def``/``if``/loops) carries as many HTML tables and at
  least one picture among its outputs.

And Markdown stays Markdown: a commented heading (``# ## Try it``) inside a code cell is
a section the reader never sees as one.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
LESSONS = sorted(p.stem for p in (NOTEBOOKS / "src").glob("*.py"))
#: calls that make a figure pyplot never shows by itself: course.new_figure, course.*_figure, course.*_bars
#: (``zerokit.plot``'s pyplot figures are shown by the inline backend at the end of the cell)
FIGURE_CALL = re.compile(r"^course(?:\.\w+)*\.(?:new_figure|\w+_figure|\w+_bars)$")


def _build_module():
    spec = importlib.util.spec_from_file_location("notebook_build", NOTEBOOKS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parse(source: str) -> ast.Module:
    """A cell's code as Python (IPython magics and shell lines blanked)."""
    return ast.parse("\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()))


def _name(func) -> str:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def _is_table(call: ast.Call) -> bool:
    return _name(call.func) == "course.table"


def _is_figure(call: ast.Call) -> bool:
    return bool(FIGURE_CALL.match(_name(call.func)))


class _Calls(ast.NodeVisitor):
    """The table and figure calls of a cell: all of them, and those that run whenever the cell runs."""

    def __init__(self):
        self.tables, self.figures, self.sure_tables, self.sure_figures = [], [], [], []
        self.depth = 0  # inside an if, a loop, a try or a comprehension: may not run

    def _branch(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    def _definition(self, node):  # what a def makes is made when it is called, by the cell that calls it
        pass

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _definition
    visit_If = visit_For = visit_While = visit_Try = visit_IfExp = _branch
    visit_ListComp = visit_GeneratorExp = visit_DictComp = visit_SetComp = _branch

    def visit_Call(self, node):
        if _is_table(node):
            self.tables.append(node)
            if not self.depth:
                self.sure_tables.append(node)
        elif _is_figure(node):
            self.figures.append(node)
            if not self.depth:
                self.sure_figures.append(node)
        self.generic_visit(node)


def _calls(tree: ast.Module) -> _Calls:
    visitor = _Calls()
    visitor.visit(tree)
    return visitor


def undisplayed(source: str) -> list:
    """What a code cell computes to show and never displays: table calls that are neither the cell's last
    expression nor inside ``display(...)``; a figure made in a cell that neither ends on an expression nor
    calls ``display``."""
    tree = _parse(source)
    last = tree.body[-1] if tree.body else None
    shown_last = last.value if isinstance(last, ast.Expr) else None
    displayed = {id(arg) for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and _name(node.func) == "display" for arg in node.args}
    found = _calls(tree)
    problems = [f"line {c.lineno}: course.table(...) is neither the cell's last expression nor inside display(...)"
                for c in found.tables if c is not shown_last and id(c) not in displayed]
    # a figure shows when the cell ends on it: a name (``fig``), ``….figure``, a figure call or a panel/helper call
    ends_on_expression = shown_last is not None and (
        isinstance(shown_last, (ast.Name, ast.Attribute))
        or isinstance(shown_last, ast.Call) and (_is_figure(shown_last) or not isinstance(shown_last.func, ast.Attribute)
                                                 or _name(shown_last.func).startswith("course.")
                                                 and _name(shown_last.func) != "course.show"))
    calls_display = any(isinstance(n, ast.Call) and _name(n.func) == "display" for n in ast.walk(tree))
    if found.figures and not (ends_on_expression or calls_display):
        problems.append(f"line {found.figures[0].lineno}: a figure is made but the cell neither ends on it "
                        "nor displays it")
    return problems


def commented_markdown(source: str) -> list:
    """Markdown headings written as comments inside a code cell (a ``# %% [markdown]`` line forgotten)."""
    return [line for line in source.splitlines() if re.match(r"^#\s*#{1,6} \S", line)]


def _code_cells(name: str):
    """(index, source) of each code cell: the index is the cell id's number (``c07``) in the built notebook."""
    cells = _build_module().parse_cells((NOTEBOOKS / "src" / f"{name}.py").read_text())
    return [(i, body) for i, (kind, body) in enumerate(cells) if kind in ("code", "checks")]


@pytest.mark.parametrize("name", LESSONS)
def test_every_table_and_figure_a_cell_makes_is_displayed(name):
    problems = [f"c{i:02d}: {p}" for i, body in _code_cells(name) for p in undisplayed(body)]
    assert not problems, f"{name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("name", LESSONS)
def test_no_section_hides_in_a_code_cell(name):
    found = [f"c{i:02d}: {line}" for i, body in _code_cells(name) for line in commented_markdown(body)]
    assert not found, f"{name}: a Markdown heading commented inside a code cell: {found}"


def _html_tables(cell) -> int:
    count = 0
    for output in cell.get("outputs", []):
        html = output.get("data", {}).get("text/html", "")
        count += ("".join(html) if isinstance(html, list) else html).count("<table")
    return count


def _pictures(cell) -> int:
    return sum(1 for output in cell.get("outputs", []) if "image/png" in output.get("data", {}))


def render_gaps(nb: dict) -> list:
    """Code cells of a run notebook whose sure tables or figures left no output behind."""
    gaps = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        found = _calls(_parse(source))
        if len(found.sure_tables) > _html_tables(cell):
            gaps.append(f"{cell.get('id')}: {len(found.sure_tables)} course.table call(s), "
                        f"{_html_tables(cell)} table(s) shown")
        if found.sure_figures and not _pictures(cell):
            gaps.append(f"{cell.get('id')}: makes a figure, shows no picture")
    return gaps


@pytest.mark.parametrize("name", LESSONS)
def test_the_committed_notebook_shows_every_table_and_figure(name):
    gaps = render_gaps(json.loads((NOTEBOOKS / f"{name}.ipynb").read_text()))
    assert not gaps, f"{name}: computed and never shown:\n" + "\n".join(gaps)


def test_the_render_checks_catch_what_they_should():
    hidden = "rows = [{'a': 1}]\ncourse.table(rows)\nx = 1\n"
    assert undisplayed(hidden) and not undisplayed("rows = []\ncourse.table(rows)\n")
    assert not undisplayed("display(course.table([]))\nx = 1\n")
    assert undisplayed("if rows:\n    course.table(rows)\n")
    assert undisplayed("fig, ax = course.new_figure(3, 2)\nax.plot([1])\n")
    assert not undisplayed("fig, ax = course.new_figure(3, 2)\nax.plot([1])\nfig\n")
    assert not undisplayed("def f():\n    fig, ax = course.new_figure(3, 2)\n    return fig\n")
    assert commented_markdown("assert x\n#\n# ## Try it\n") == ["# ## Try it"]
    cell = {"cell_type": "code", "id": "c1", "source": hidden, "outputs": []}
    assert render_gaps({"cells": [cell]}) == ["c1: 1 course.table call(s), 0 table(s) shown"]
    cell["outputs"] = [{"output_type": "display_data", "data": {"text/html": "<table></table>"}}]
    assert render_gaps({"cells": [cell]}) == []
