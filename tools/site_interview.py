"""The site's interview page, generated from the committed lessons: every question the course asks, its answer,
what the run printed, a link to the cell that shows it and the one command that reproduces it.

Lifecycle (``tools/build_site.py`` calls it while it stages the site's sources):

1. :func:`lesson_questions` reads a lesson's ``## Interview questions`` section — numbered questions
   ``N. *Question?*``, each answer hidden in ``<details><summary>Answer</summary> … </details>`` (the format
   ``tests/course/test_notebooks.py`` holds every lesson to) — and :func:`seed_questions` the seed's questions
   from ``docs/seed.md`` where that page exists;
2. :func:`demonstrating_cell` finds the code cell of the lesson that shows each answer: of the cells before the
   interview section that printed something, the one whose source, outputs and explanation (the markdown just
   above it) share the most of the answer's words, rare words counting more (inverse document frequency over the
   lesson's cells), a backticked name or a number of the answer found verbatim counting most. A lexical match, not
   a reading: a question with no shared word links to the lesson's top;
3. :func:`with_anchors` gives the site's copy of a lesson an anchor before each such cell (a markdown cell of MyST
   targets, ``(interview-NN-Q)=``, invisible), :func:`render` writes the page: per lesson, each question, its answer,
   the cell's printed text (collapsed), the link and the command — a ``zerokit …`` command the answer or the
   cell's explanation names, else ``make lab`` and the lesson to run.

Only the standard library: the page is markdown that Sphinx (myst) renders.
"""
from __future__ import annotations

import base64
import collections
import dataclasses
import html
import json
import math
import posixpath
import re
import textwrap
from pathlib import Path

#: the hidden answer of a question, as tests/course/test_notebooks.py's interview_problems reads it
HIDDEN_ANSWER = re.compile(r"<details>\s*<summary>\s*Answer\s*</summary>(?P<answer>.*?)</details>", re.S)
#: a numbered question: its number and the question in italics
QUESTION = re.compile(r"^[ \t]*(?P<number>\d+)\. \*(?P<question>[^*]+)\*", re.M)
#: a zerokit command named in backticks (one line; `zerokit grade` grades exercises, it reproduces nothing)
COMMAND = re.compile(r"`(?P<command>zerokit (?:compare|plan|tour|bench)\b[^`\n]*)`")
#: a cell that builds one of the course's interactive panels
PANEL = re.compile(r"course\.\w+Panel\(")
#: the most lines of a cell's printed text the page shows under a question
PRINTED_LINES = 24

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*[A-Za-z0-9]|\d+(?:[.,]\d+)*")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)+(?![\w])|(?<![\w.])\d{3,}(?![\w])")
_STOP = frozenset("""the a an and or of to in on at by for with from as is are was were be been it its this that these
those what which who how why when where does do did not no yes than then there their they them each every one two
into per over under same more most less only also can could would should will so if but all any both other
about after before between out up down own such here above below just whose what's isn't doesn't don't""".split())


@dataclasses.dataclass(frozen=True)
class Question:
    """One interview question of the course, where it is shown, and how to reproduce it."""
    source: str  # the repository path of the page that asks it: notebooks/NN_name.ipynb or docs/seed.md
    lesson: str  # the lesson's stem (or "seed")
    title: str  # the page's title (its first heading)
    number: int
    question: str  # markdown
    answer: str  # markdown
    cell: int | None  # the demonstrating cell's index in the lesson's cells, None where none was found
    anchor: str | None  # the id the site's copy of the lesson carries before that cell
    heading: str | None  # the heading the cell sits under
    printed: str | None  # the cell's printed text (its stream or text/plain output), at most PRINTED_LINES lines
    figure: bytes | None  # the cell's last picture (PNG)
    shown_in: str | None  # the repository path of the notebook that holds that cell
    command: str  # the one command that reproduces it
    context: str = ""  # markdown shown under the question (the seed's original words, where it is answered): a `zerokit …` line, or `make lab` and the lesson run in it


def cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _joined(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def printed_text(cell: dict) -> str:
    """What a code cell printed, as text: its streams, then each rich output's markdown or plain text (a figure's
    plain text, ``<Figure size …>``, is no text: :func:`figure` is its picture)."""
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append(_joined(output.get("text", "")))
        data = output.get("data", {})
        if "image/png" in data:
            continue
        for mime in ("text/markdown", "text/plain"):
            if mime in data:
                parts.append(_joined(data[mime]))
                break
    return "\n".join(p.rstrip("\n") for p in parts if p.strip())


def figure(cell: dict) -> bytes | None:
    """The last picture a code cell drew (its PNG), None where it drew none."""
    pictures = [o["data"]["image/png"] for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    return base64.b64decode(_joined(pictures[-1])) if pictures else None


def _output_words(cell: dict) -> str:
    """Every text of a cell's outputs, HTML tables included (their tags dropped)."""
    texts = [printed_text(cell)]
    for output in cell.get("outputs", []):
        if "text/html" in output.get("data", {}):
            texts.append(html.unescape(re.sub(r"<[^>]+>", " ", _joined(output["data"]["text/html"]))))
    return "\n".join(texts)


def title_of(cells: list) -> str:
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            for line in cell_source(cell).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    raise ValueError("a page of the site has no '# Title' heading in its markdown")


def _interview_section(markdown: str) -> str:
    section = markdown.split("## Interview questions", 1)[1]
    following = re.search(r"^#{1,2} ", section, flags=re.M)  # the section ends at the next heading of its level
    return section[:following.start()] if following else section


def parse_questions(section: str, where: str) -> list[tuple[int, str, str]]:
    """(number, question, answer) of each ``N. *Question?*`` of ``section`` with its hidden answer."""
    starts = list(QUESTION.finditer(section))
    found = []
    for match, following in zip(starts, starts[1:] + [None]):
        item = section[match.start():following.start() if following else len(section)]
        hidden = HIDDEN_ANSWER.search(item)
        if hidden is None or not hidden.group("answer").strip():
            raise ValueError(f"{where}: question {match.group('number')} has no "
                             "<details><summary>Answer</summary> … </details> answer")
        question = " ".join(match.group("question").split())
        found.append((int(match.group("number")), question, textwrap.dedent(hidden.group("answer")).strip()))
    return found


def interview_cell(cells: list) -> int:
    """The index of the lesson's cell that holds its ``## Interview questions``."""
    for index, cell in enumerate(cells):
        if cell.get("cell_type") == "markdown" and "## Interview questions" in cell_source(cell):
            return index
    raise ValueError("the lesson has no '## Interview questions' section")


def _words(text: str) -> set[str]:
    return {w.lower().rstrip(".") for w in _WORD.findall(text)} - _STOP


def _explanation(cells: list, index: int) -> str:
    """The markdown just above a code cell (up to the previous code cell): what it is said to show. The lesson's
    opening (its first cell: the question, what you will see) explains the whole lesson, no cell of it."""
    texts = []
    for position in range(index - 1, 0, -1):
        if cells[position].get("cell_type") == "code":
            break
        texts.append(cell_source(cells[position]))
    return "\n".join(reversed(texts))


def demonstrating_cell(cells: list, question: str, answer: str, before: int) -> int | None:
    """The index of the code cell, among ``cells[:before]`` that printed or drew something, that best matches the
    question and its answer (the module's docstring says how); None where no cell shares a word with them."""
    candidates = [i for i in range(before) if cells[i].get("cell_type") == "code" and cells[i].get("outputs")]
    if not candidates:
        return None
    texts = {i: "\n".join((cell_source(cells[i]), _output_words(cells[i]), _explanation(cells, i)))
             for i in candidates}
    words = {i: _words(t) for i, t in texts.items()}
    frequency = collections.Counter(w for ws in words.values() for w in ws)
    idf = {w: math.log((1 + len(candidates)) / (1 + n)) + 1.0 for w, n in frequency.items()}
    asked = _words(question + "\n" + answer)
    names = {m.strip() for m in re.findall(r"`([^`\n]+)`|\"([^\"\n]{3,40})\"|“([^”\n]{3,40})”", answer)
             for m in m if len(m.strip()) >= 3}  # backticked names and quoted phrases (the "8 → 64" row)
    numbers = {_digits(n) for n in _NUMBER.findall(answer)}
    weight = {i: sum(idf[w] for w in words[i]) for i in candidates}
    mean_weight = sum(weight.values()) / len(weight)
    strongest = max(idf.values())
    best, best_score = None, 0.0
    for i in candidates:
        shared = sum(idf[w] for w in asked & words[i])
        shared += sum(3 * strongest for name in names if name in texts[i])
        shared += sum(3 * strongest for number in numbers if number in _digits(_output_words(cells[i])))
        # a long cell shares many words by its length alone: the score is divided by the root of the cell's own
        # weight, damped by the lesson's mean (a short cell is not preferred for being short)
        score = shared / math.sqrt(weight[i] + mean_weight)
        if PANEL.search(cell_source(cells[i])):
            score /= 2  # a live panel: a static page shows only its last picture, the cell that printed shows more
        if score > best_score:  # ties: the earlier cell, where the lesson first shows it
            best, best_score = i, score
    return best


def _digits(text: str) -> str:
    """Thousands separators dropped (6,144 → 6144): a number of the answer is found however the run printed it."""
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)


def _heading_above(cells: list, index: int) -> str | None:
    for cell in reversed(cells[:index]):
        if cell.get("cell_type") == "markdown":
            headings = re.findall(r"^#{1,3} (.+)$", cell_source(cell), flags=re.M)
            if headings:
                return headings[-1].strip()
    return None


def _printed_excerpt(cell: dict) -> str | None:
    text = printed_text(cell).strip("\n")
    if not text:
        return None
    lines = text.splitlines()
    if len(lines) > PRINTED_LINES:
        lines = lines[:PRINTED_LINES] + [f"… ({len(lines) - PRINTED_LINES} more lines in the lesson)"]
    return "\n".join(lines)


def _command(answer: str, explanation: str) -> str:
    for text in (answer, explanation):
        named = COMMAND.search(text)
        if named:
            return named.group("command")
    return "make lab"


def lesson_questions(path: Path, repository: Path) -> list[Question]:
    """Every interview question of the lesson at ``path`` (a committed notebook), with its demonstrating cell."""
    cells = json.loads(path.read_text())["cells"]
    at = interview_cell(cells)
    source = path.resolve().relative_to(repository.resolve()).as_posix()
    lesson, title = path.stem, title_of(cells)
    questions = []
    for number, question, answer in parse_questions(_interview_section(cell_source(cells[at])), source):
        cell = demonstrating_cell(cells, question, answer, before=at)
        explanation = _explanation(cells, cell) if cell is not None else ""
        questions.append(Question(
            source=source, lesson=lesson, title=title, number=number, question=question, answer=answer, cell=cell,
            anchor=f"interview-{lesson.split('_', 1)[0]}-{number}" if cell is not None else None,
            heading=_heading_above(cells, cell) if cell is not None else None,
            printed=_printed_excerpt(cells[cell]) if cell is not None else None,
            figure=figure(cells[cell]) if cell is not None else None, shown_in=source, command=_command(answer, explanation)))
    return questions


def rebased(markdown: str, folder: str) -> str:
    """``markdown``'s relative links, written from ``folder`` of the repository, made relative to its root."""
    return re.sub(r"\]\((?![a-z][a-z0-9+.-]*:|#|/)([^)\s]+)\)",
                  lambda m: f"]({posixpath.normpath(posixpath.join(folder, m.group(1)))})", markdown)


def _table_rows(section: str) -> list[list[str]]:
    """The body rows of the markdown tables in ``section``, each a list of its cells (header and rule dropped)."""
    rule = re.compile(r"\s*\|?[\s:|-]*-[\s:|-]*\|?\s*")
    rows: list[list[str]] = []
    blocks = re.findall(r"(?:^[ \t]*\|.*\n?)+", section, flags=re.M)  # runs of consecutive table lines
    for block in blocks:
        lines = block.strip("\n").splitlines()
        if len(lines) >= 2 and rule.fullmatch(lines[1]):
            rows += [[cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))] for line in lines[2:]]
    return rows


def seed_questions(path: Path, repository: Path, default_lesson: Path | None) -> list[Question]:
    """The seed's questions, from ``docs/seed.md``: those of its sections whose heading names questions. A
    question is a row of a table there whose first cell asks something ('?'), the rest of the row shown with it
    (the original, where it is answered) and the cell that shows it looked for in the first lesson the row links;
    or a numbered or bulleted item (or a sub-heading) ending in '?', its answer the ``<details>`` under it or else
    the text up to the next question, its cell looked for in ``default_lesson`` (lesson 12)."""
    text = path.read_text()
    source = path.resolve().relative_to(repository.resolve()).as_posix()
    folder = posixpath.dirname(source)
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), "The seed")
    item = re.compile(r"^(?:[ \t]*(?:\d+[.)]|[-*])[ \t]+|#{3,6}[ \t]+)(?P<question>[^\n|]*\?[*_\"”」）)]*)[ \t]*$", re.M)
    found: list[tuple[str, str, str, Path | None]] = []  # question, answer, context, the lesson to look in
    for section in re.split(r"^(?=## )", text, flags=re.M):
        if not section.startswith("## ") or "question" not in section.splitlines()[0].lower():
            continue
        header = next((line for line in section.splitlines() if line.lstrip().startswith("|")), "")
        names = [cell.strip() for cell in header.strip().strip("|").split("|")]
        for row in _table_rows(section):
            if "?" not in row[0]:
                continue
            lessons = [repository / folder / link for link in re.findall(r"\]\(([^)\s#]+\.ipynb)", " ".join(row[1:]))]
            lessons = [p.resolve() for p in lessons if p.resolve().exists()]
            context = " · ".join(f"*{name}:* {rebased(cell, folder)}" for name, cell in zip(names[1:], row[1:]) if cell)
            found.append((row[0], "", context, lessons[0] if lessons else default_lesson))
        matches = list(item.finditer(section))
        for match, following in zip(matches, matches[1:] + [None]):
            body = section[match.end():following.start() if following else len(section)]
            hidden = HIDDEN_ANSWER.search(body)
            answer = textwrap.dedent(hidden.group("answer") if hidden else body).strip()
            found.append((match.group("question"), rebased(answer, folder), "", default_lesson))
    questions = []
    for number, (question, answer, context, lesson) in enumerate(found, start=1):
        question = " ".join(question.split()).strip("*_ ")  # a question in italics: its text
        cells = json.loads(lesson.read_text())["cells"] if lesson else []
        cell = demonstrating_cell(cells, question, answer, interview_cell(cells)) if cells else None
        questions.append(Question(
            source=source, lesson="seed", title=title, number=number, question=question, answer=answer,
            cell=cell, anchor=f"interview-seed-{number}" if cell is not None else None,
            heading=_heading_above(cells, cell) if cell is not None else None,
            printed=_printed_excerpt(cells[cell]) if cell is not None else None,
            figure=figure(cells[cell]) if cell is not None else None,
            shown_in=lesson.relative_to(repository.resolve()).as_posix() if lesson else None,
            command=_command(answer, ""), context=context))
    return questions


def with_anchors(notebook: dict, anchors: dict[int, list[str]]) -> dict:
    """A copy of ``notebook`` with invisible anchors (MyST targets, ``(interview-03-1)=``) before the cells
    ``anchors`` names: the cell after them carries their ids."""
    cells = []
    for index, cell in enumerate(notebook["cells"]):
        if anchors.get(index):
            targets = "".join(f"({anchor})=\n" for anchor in anchors[index])  # MyST targets: the next cell's ids
            cells.append({"cell_type": "markdown", "id": anchors[index][0], "metadata": {}, "source": targets})
        cells.append(cell)
    return {**notebook, "cells": cells}


def anchors_by_cell(questions: list[Question]) -> dict[int, list[str]]:
    """The anchors each demonstrating cell of one lesson gets, by the cell's index."""
    anchors: dict[int, list[str]] = {}
    for q in questions:
        if q.cell is not None and q.anchor:
            anchors.setdefault(q.cell, []).append(q.anchor)
    return anchors


def _quote_block(text: str) -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}text\n{text}\n{fence}"


def figure_path(q: Question) -> str:
    """Where the site keeps the picture of a question's cell (relative to the interview page)."""
    return f"interview/{q.anchor}.png"


def figures(questions: list[Question]) -> dict[str, bytes]:
    """The pictures the interview page shows, by their path relative to the page."""
    return {figure_path(q): q.figure for q in questions if q.figure and q.anchor}


def render(lessons: list[list[Question]], seed: list[Question]) -> str:
    """The interview page's markdown, for a page at the site's root: the seed's questions, then each lesson's."""
    asked = sum(len(qs) for qs in lessons)
    counted = (f"{asked + len(seed)} in all: {asked} from the ends of {sum(1 for qs in lessons if qs)} lessons and "
               f"{len(seed)} from the seed" if seed else f"{asked} from the ends of {sum(1 for qs in lessons if qs)} lessons")
    out = ["# Interview questions", "",
           f"Every interview question the course asks ({counted}), with its answer (open it when you have answered), "
           "what the run printed, the cell that shows it and the command that reproduces it. Generated from the "
           "committed notebooks by `tools/build_site.py`: the cell is the one whose source and outputs share the "
           "most with the answer.", ""]

    def entry(q: Question) -> list[str]:
        label = "seed" if q.lesson == "seed" else q.lesson.split("_", 1)[0]
        lines = [f"### {label}.{q.number} · {q.question}", ""] + ([q.context, ""] if q.context else [])
        if q.answer:
            lines += ["<details><summary>Answer</summary>", "", q.answer, "", "</details>", ""]
        if q.printed or q.figure:
            shown = [_quote_block(q.printed)] if q.printed else []
            shown += [f"![The figure the cell drew]({figure_path(q)})"] if q.figure else []
            what = "printed" if not q.figure else "drew" if not q.printed else "printed and drew"
            lines += [f"<details><summary>What the run {what}</summary>", "", "\n\n".join(shown), "",
                      "</details>", ""]
        lesson = f"lesson {Path(q.shown_in).stem.split('_', 1)[0]}" if q.shown_in else None
        if q.anchor:  # a label the site's copy of the lesson carries before the cell
            where = (f"the cell under “{q.heading}”" if q.heading else "the cell").replace("`", "").replace("<", "‹")
            shown = f"{lesson}, " + "{ref}`" + where + f" <{q.anchor}>`"
        else:
            shown = f"[{q.title}]({q.source})"
        how = f"`{q.command}`" + (f", then run {lesson} top to bottom (*Run → Run All Cells*)"
                                  if q.command == "make lab" and lesson else "")
        return lines + [f"**Shown in** {shown}. **Reproduce:** {how}.", ""]

    if seed:
        out += [f"## [The seed's questions]({seed[0].source})", ""]
        for q in seed:
            out += entry(q)
    for qs in lessons:
        if qs:
            out += [f"## [{qs[0].title}]({qs[0].source})", ""]
            for q in qs:
                out += entry(q)
    return "\n".join(out).rstrip() + "\n"
