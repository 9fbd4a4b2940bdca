"""docs/facilitator.md: its common mistakes are what tools/common_mistakes.py makes of the grader's planted wrong
answers, and its agendas add up and quote the course's own estimates."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from zerokit.grade.exercises import get, KEYS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "facilitator.md"


def _tool():
    spec = importlib.util.spec_from_file_location("common_mistakes", ROOT / "tools" / "common_mistakes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page_rows(tool) -> dict:
    """{exercise number: [(mistake, check, points)]} as the page's section lists them."""
    page = PAGE.read_text()
    text = page[page.index(tool.BEGIN):page.index(tool.END)]
    rows, number = {}, None
    for line in text.splitlines():
        heading = re.match(r"### (\d\d) · ", line)
        if heading:
            number = heading.group(1)
            rows[number] = []
        row = re.match(r"\| (.+?) \| `([\w-]+)` \((\d+) pts?\) \|", line)
        if row:
            rows[number].append((row.group(1).replace("\\|", "|"), row.group(2), int(row.group(3))))
    return rows


def test_every_planted_mistake_is_on_the_page_with_the_check_that_catches_it():
    tool = _tool()
    expected = {get(k).number: [] for k in KEYS}
    for planted in tool.planted_mistakes():
        points = next(c.points for c in get(planted.exercise).checks if c.name == planted.check)
        expected[get(planted.exercise).number].append((" ".join(planted.what.split()), planted.check, points))
    assert _page_rows(tool) == expected, "docs/facilitator.md is out of date: run python tools/common_mistakes.py"


@pytest.mark.slow
def test_the_common_mistakes_are_what_the_grader_says_now():
    """Every planted mistake graded again on its check: the page's hints are the ones a learner is shown."""
    tool = _tool()
    page = PAGE.read_text()
    assert tool.with_section(page, tool.section(tool.graded(tool.planted_mistakes()))) == page, \
        "docs/facilitator.md is out of date: run python tools/common_mistakes.py"


def _lesson_times() -> dict:
    """{lesson number: (minutes, run seconds)} from notebooks/README.md's path table ("… | 25 min (run 7 s) |")."""
    found = {}
    for line in (ROOT / "notebooks" / "README.md").read_text().splitlines():
        row = re.match(r"\| \[(\d\d) · .*?\| (\d+) min \(run (\d+) s\) \|", line)
        if row:
            found[row.group(1)] = (int(row.group(2)), int(row.group(3)))
    return found


def _lesson_estimates() -> dict:
    return {n: minutes for n, (minutes, _) in _lesson_times().items()}


def test_the_lesson_table_quotes_the_course_map():
    quoted = {m.group(1): (int(m.group(2)), int(m.group(3)))
              for m in re.finditer(r"(?m)^\| (\d\d) · [^|]+ \| (\d+) min \| (\d+) s \|", PAGE.read_text())}
    assert quoted == _lesson_times()


def _agendas() -> list:
    """Each agenda table: [(start minute of the day, what, minutes)]."""
    tables, current = [], None
    for line in PAGE.read_text().splitlines():
        row = re.match(r"\| (\d\d):(\d\d) \| (.+) \| (\d+) \|$", line)
        if row:
            if current is None:
                current = []
                tables.append(current)
            current.append((int(row.group(1)) * 60 + int(row.group(2)), row.group(3), int(row.group(4))))
        elif not line.startswith("|"):
            current = None
    return tables


def test_the_agendas_add_up_and_quote_the_courses_estimates():
    tables = _agendas()
    assert len(tables) == 4  # one day; three days
    lessons = _lesson_estimates()
    assert len(lessons) == 18
    for table in tables:
        assert table[0][0] == 9 * 60
        for (start, what, minutes), (following, _, _) in zip(table, table[1:]):
            assert start + minutes == following, what
        assert table[-1][0] + table[-1][2] == 17 * 60
        for _, what, minutes in table:
            lesson = re.match(r"lesson (\d\d) · ", what)
            exercise = re.match(r"exercise (\d\d) · ", what)
            if lesson:
                assert minutes == lessons[lesson.group(1)], what
            if exercise:
                assert minutes == get(exercise.group(1)).minutes, what
            for number, quoted in re.findall(r"\b(\d\d) \((\d+)\)", what):  # "one of exercise 10 (45), …"
                assert int(quoted) == get(number).minutes, what
    three_days = [what for table in tables[1:] for _, what, _ in table]
    assert sorted(re.match(r"lesson (\d\d)", w).group(1) for w in three_days if w.startswith("lesson ")) == \
        sorted(lessons)
    in_class = {re.match(r"exercise (\d\d)", w).group(1) for w in three_days if w.startswith("exercise ")}
    assert {get(k).number for k in KEYS} - in_class == {"10", "13", "14"}  # one of them in class, two at home
