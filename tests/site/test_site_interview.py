"""The site's interview page (tools/site_interview.py), without Sphinx: every lesson's interview questions are on
it with their answers; the cell it links is the one that printed the answer's number; the seed's questions are read
from docs/seed.md where it exists; a question with no hidden answer is refused, naming it."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


sys.path.insert(0, str(ROOT / "tools"))  # tools/ is not a package: its modules import one another by name
interview = importlib.import_module("site_interview")


def _asked(lesson: Path) -> list[str]:
    """A lesson's interview questions, read here on their own: each ``N. *…*`` after ``## Interview questions``."""
    cells = json.loads(lesson.read_text())["cells"]
    text = next("".join(c["source"]) for c in cells
                if c["cell_type"] == "markdown" and "## Interview questions" in "".join(c["source"]))
    section = text.split("## Interview questions", 1)[1]
    return [" ".join(q.split()) for q in re.findall(r"^\s*\d\. \*([^*]+)\*", section, flags=re.M)]


def _code(source: str, printed: str = "", png: bool = False) -> dict:
    outputs = [{"output_type": "stream", "name": "stdout", "text": printed}] if printed else []
    if png:
        outputs.append({"output_type": "display_data", "metadata": {},
                        "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure size 800x420 with 1 Axes>"}})
    return {"cell_type": "code", "metadata": {}, "source": source, "outputs": outputs, "execution_count": 1}


def _markdown(source: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": source}


def test_the_page_lists_every_lessons_questions_with_their_answers():
    lessons = [interview.lesson_questions(path, ROOT) for path in LESSONS]
    page = " ".join(interview.render(lessons, []).split())
    for path, questions in zip(LESSONS, lessons):
        asked = _asked(path)
        assert len(asked) >= 2, f"{path.name}: the test reads no interview questions"
        assert [q.question for q in questions] == asked, path.name
        for q in questions:
            assert q.question in page and " ".join(q.answer.split()) in page, f"{path.name} {q.number}"
            assert q.command == "make lab" or q.command.startswith("zerokit "), q.command
    assert page.count("**Reproduce:**") == sum(len(_asked(p)) for p in LESSONS)
    assert len(LESSONS) == 18


def test_every_question_links_a_cell_that_printed_or_drew_something():
    for path in LESSONS:
        cells = json.loads(path.read_text())["cells"]
        for q in interview.lesson_questions(path, ROOT):
            assert q.cell is not None and q.anchor == f"interview-{path.name[:2]}-{q.number}", (path.name, q.number)
            assert cells[q.cell]["cell_type"] == "code" and cells[q.cell]["outputs"]
            assert q.printed or q.figure


def test_the_linked_cell_is_the_one_that_printed_the_answers_number():
    cells = [_markdown("# 00 · A lesson\n\nThe opening: ranks, bytes, all-reduce, ring, tensor, table."),
             _markdown("## A rank"), _code("print(rank)", "rank 0 of 4"),
             _markdown("## A collective"), _code("print(table)", "payload B  ring cost B\n4,096  6,144"),
             _markdown("## A figure"), _code("plot()", png=True),
             _markdown("## Interview questions\n\n1. *With 4 ranks, how many bytes?*\n\n"
                       "   <details><summary>Answer</summary>\n\n   2·3/4·4096 = 6144 B.\n\n   </details>\n")]
    assert interview.demonstrating_cell(cells, "With 4 ranks, how many bytes?", "2·3/4·4096 = 6144 B.", 7) == 4
    # a backticked name of the answer found in a cell's source counts as much
    assert interview.demonstrating_cell(cells, "What does it draw?", "The figure of `plot`.", 7) == 6
    assert interview.demonstrating_cell(cells, "Qqq?", "Zzz.", 7) is None  # no shared word: no cell
    assert interview.demonstrating_cell(cells, "Qqq?", "Zzz.", 1) is None  # no code cell before it


def test_a_figure_is_a_picture_not_its_placeholder_text():
    cell = _code("plot()", png=True)
    assert interview.printed_text(cell) == "" and interview.figure(cell) == b"\x89PNG\r\n\x1a\n"


def test_a_zerokit_command_the_answer_names_is_the_one_to_run():
    assert interview._command("The planner (`zerokit plan --strategy hsdp`) sizes it.", "") == \
        "zerokit plan --strategy hsdp"
    assert interview._command("Graded by `zerokit grade 02`.", "") == "make lab"  # grading reproduces nothing
    assert interview._command("No command.", "the cell above runs `zerokit compare a.py:f`") == \
        "zerokit compare a.py:f"


def test_a_question_without_its_hidden_answer_is_refused_by_name():
    section = ("\n\n1. *Why?*\n\n   <details><summary>Answer</summary>\n\n   Because.\n\n   </details>\n\n"
               "2. *How?* — in plain sight\n")
    with pytest.raises(ValueError, match=r"notebooks/99_x.ipynb: question 2 has no <details>"):
        interview.parse_questions(section, "notebooks/99_x.ipynb")
    assert interview.parse_questions(section.split("2.")[0], "x") == [(1, "Why?", "Because.")]


def test_the_anchor_stands_before_its_cell_and_changes_no_cell():
    notebook = {"cells": [_markdown("# T"), _code("a", "1"), _code("b", "2")], "metadata": {}, "nbformat": 4,
                "nbformat_minor": 5}
    anchored = interview.with_anchors(notebook, {2: ["interview-00-1", "interview-seed-1"]})
    assert anchored["cells"][0] == notebook["cells"][0] and anchored["cells"][1] == notebook["cells"][1]
    assert anchored["cells"][2]["source"] == "(interview-00-1)=\n(interview-seed-1)=\n"
    assert anchored["cells"][2]["id"] == "interview-00-1" and anchored["cells"][3] == notebook["cells"][2]
    assert len(notebook["cells"]) == 3  # the lesson itself is left as it was


def test_the_seeds_questions_come_from_docs_seed_with_the_cell_that_shows_each(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "docs" / "seed.md").write_text(
        "# The seed\n\nAn interview article.\n\n## Its claims\n\n- Is this a question? Not in this section.\n\n"
        "| claim | verdict |\n|---|---|\n| Is ZeRO-1 a third? | no |\n\n"
        "## Its questions\n\n| the question, in English | the original | answered in |\n|---|---|---|\n"
        "| How does ZeRO handle a dynamic graph? | 深度追问：ZeRO如何处理动态计算图？ | "
        "[lesson 06](../notebooks/06_zero3.ipynb), [12](../notebooks/12_the_interview.ipynb) |\n"
        "| What it tests: the limits | 核心考点 | the course |\n\n"
        "1. *What is the difference between data and model parallelism?*\n\n"
        "   <details><summary>Answer</summary>\n\n   Data parallelism copies the model.\n\n   </details>\n\n"
        "2. How does ZeRO combine the two?\n\n   It shards the states.\n\n"
        "### 深度追问: does ZeRO need gradient synchronisation?\n\nYes: a reduce-scatter.\n")
    lesson = {"cells": [_markdown("# 12 · The interview\n\nThe opening."), _markdown("## Q1"),
                        _code("compare()", "data parallel holds the whole model; model parallel a part"),
                        _markdown("## Interview questions\n\n1. *A?*\n\n   <details><summary>Answer</summary>\n\n"
                                  "   a\n\n   </details>\n\n2. *B?*\n\n   <details><summary>Answer</summary>\n\n"
                                  "   b\n\n   </details>\n")],
              "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "notebooks" / "12_the_interview.ipynb").write_text(json.dumps(lesson))
    zero3 = {"cells": [_markdown("# 06 · ZeRO-3"), _markdown("## Shapes"), _code("shapes()", "a shape"),
                       _markdown("## A dynamic graph"), _code("branch()", "the trace is stale: ZeRO-3 re-records"),
                       *lesson["cells"][3:]], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "notebooks" / "06_zero3.ipynb").write_text(json.dumps(zero3))
    seed = interview.seed_questions(tmp_path / "docs" / "seed.md", tmp_path,
                                    tmp_path / "notebooks" / "12_the_interview.ipynb")
    table, seed = seed[0], seed[1:]
    assert table.question == "How does ZeRO handle a dynamic graph?" and table.answer == ""
    assert table.shown_in == "notebooks/06_zero3.ipynb" and table.cell == 4 and table.anchor == "interview-seed-1"
    assert table.context == ("*the original:* 深度追问：ZeRO如何处理动态计算图？ · *answered in:* "
                             "[lesson 06](notebooks/06_zero3.ipynb), [12](notebooks/12_the_interview.ipynb)")
    assert [q.question for q in seed] == [
        "What is the difference between data and model parallelism?", "How does ZeRO combine the two?",
        "深度追问: does ZeRO need gradient synchronisation?"]
    assert [q.answer for q in seed] == ["Data parallelism copies the model.", "It shards the states.",
                                        "Yes: a reduce-scatter."]
    assert seed[0].cell == 2 and seed[0].anchor == "interview-seed-2"
    assert seed[0].shown_in == "notebooks/12_the_interview.ipynb" and seed[0].source == "docs/seed.md"
    page = interview.render([], [table, *seed])
    assert "## [The seed's questions](docs/seed.md)" in page and "### seed.4 · 深度追问" in page
    assert "lesson 12, {ref}`the cell under “Q1” <interview-seed-2>`" in page
    assert "lesson 06, {ref}`the cell under “A dynamic graph” <interview-seed-1>`" in page
    assert "`make lab`, then run lesson 06 top to bottom" in page
