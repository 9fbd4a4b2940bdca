"""Write the facilitator's "common mistakes" from the grader's planted wrong answers: docs/facilitator.md stays in sync.

The grader's tests plant named wrong answers in every exercise (``tests/grade/test_grade*.py``, each in a table
called ``WRONG``: a name, small edits of the solution, the check that must catch it, words its message must hold).
Lifecycle of one run:

1. :func:`planted_mistakes` reads those tables (each test file's layout has its reader in :data:`READERS`; a test
   file with a ``WRONG`` table and no reader stops the run, so no mistake goes missing from the page) and makes
   each wrong answer's source with the test file's own edit helpers;
2. :func:`graded` grades each on the one check that must catch it (``zerokit.grade(path, checks=[check])``) and
   keeps the hint the learner is shown; a mistake the check lets pass stops the run;
3. :func:`section` writes one table per exercise — the mistake, the check that catches it (its points), the
   grader's words (the part its test holds fixed; the measured numbers around them are left out) and the hint —
   and :func:`main` puts it between :data:`BEGIN` and :data:`END` in ``docs/facilitator.md``.

    python tools/common_mistakes.py           # rewrite the section
    python tools/common_mistakes.py --check   # exit 1 when the page differs from what the grader says now

``tests/test_facilitator.py`` fails when the page differs. It needs the repository (``tests/`` and
``solutions/``), not the learner's bundle.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "grade"
PAGE = ROOT / "docs" / "facilitator.md"
BEGIN = "<!-- common mistakes: written by tools/common_mistakes.py from the grader's planted wrong answers -->"
END = "<!-- end of the common mistakes -->"


class Planted(NamedTuple):
    exercise: str
    what: str
    check: str
    words: str
    source: str


def _test_module(name: str):
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    return importlib.import_module(name)


def _read_test_grade(m) -> list:
    """test_grade.py: [(exercise, what, edits, check, words)]; an edit ("ring_block", new) replaces exercise 01's
    solution block."""
    out = []
    for key, what, edits, check, words in m.WRONG:
        edits = [m._block(key, 0, new) if old == "ring_block" else (old, new) for old, new in edits]
        out.append(Planted(key, what, check, words, m._edited(key, *edits)))
    return out


def _read_by_exercise_lists(m) -> list:
    """test_grade_extra.py: {exercise: [(what, edits, check, words)]}."""
    return [Planted(key, what, check, words, m._edited(key, edits))
            for key, rows in m.WRONG.items() for what, edits, check, words in rows]


def _read_by_exercise_dicts(m) -> list:
    """test_grade_more.py: {exercise: {what: (edits, check, words)}}."""
    planted = _test_module("planted")
    return [Planted(key, what, check, words, planted.planted(planted.solution(key), edits, f"{key}, {what}"))
            for key, rows in m.WRONG.items() for what, (edits, check, words) in rows.items()]


def _read_one_exercise(m) -> list:
    """test_grade_cp.py, test_grade_quantized.py, test_grade_moe.py: KEY and {what: (edits, check, words)}, the
    edits made by the file's own ``_edited(source, edits, what)`` where it has one."""
    planted = _test_module("planted")
    edit = getattr(m, "_edited", None) or planted.planted
    return [Planted(m.KEY, what, check, words, edit(planted.solution(m.KEY), edits, what))
            for what, (edits, check, words) in m.WRONG.items()]


#: test file (module name) -> the reader of its WRONG table
READERS = {
    "test_grade": _read_test_grade,
    "test_grade_extra": _read_by_exercise_lists,
    "test_grade_more": _read_by_exercise_dicts,
    "test_grade_cp": _read_one_exercise,
    "test_grade_quantized": _read_one_exercise,
    "test_grade_moe": _read_one_exercise,
}


def planted_mistakes() -> list:
    """Every planted wrong answer of the grader's tests, by exercise, in each table's order."""
    found = []
    for path in sorted(TESTS.glob("test_*.py")):
        module = _test_module(path.stem)
        if not hasattr(module, "WRONG"):
            continue
        if path.stem not in READERS:
            raise SystemExit(f"common_mistakes: {path.relative_to(ROOT)} plants wrong answers (WRONG) in a layout "
                             f"this tool does not read: add its reader to READERS")
        found += READERS[path.stem](module)
    return sorted(found, key=lambda p: p.exercise)  # stable: each table's order within an exercise


def graded(mistakes: list) -> list:
    """``[(planted, CheckResult)]``: each wrong answer graded on the check that must catch it."""
    from zerokit.grade import grade

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, planted in enumerate(mistakes):
            path = Path(tmp) / f"{i:03d}" / f"{planted.exercise}.py"
            path.parent.mkdir()
            path.write_text(planted.source)
            result = grade(path, planted.exercise, checks=[planted.check]).result(planted.check)
            if result.passed or planted.words not in result.detail:
                raise SystemExit(f"common_mistakes: {planted.exercise}, {planted.what!r}: {planted.check} "
                                 f"{'passed' if result.passed else 'says ' + repr(result.detail)}")
            out.append((planted, result))
    return out


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def section(results: list) -> str:
    """The section's markdown, :data:`BEGIN` and :data:`END` included."""
    from zerokit.grade.exercises import get, KEYS

    lines = [BEGIN, ""]
    for key in KEYS:
        spec = get(key)
        rows = [(p, r) for p, r in results if p.exercise == key]
        lines.append(f"### {spec.number} · {spec.title}")
        lines.append("")
        if not rows:
            lines += ["No wrong answer is planted in this exercise's tests yet.", ""]
            continue
        lines += ["| mistake | caught by | the grader says | the hint it shows |", "|---|---|---|---|"]
        for planted, result in rows:
            points = f"{result.points} pt{'s' if result.points != 1 else ''}"
            lines.append(f"| {_cell(planted.what)} | `{planted.check}` ({points}) | …{_cell(planted.words)}… "
                         f"| {_cell(result.hint or '')} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def with_section(page: str, text: str) -> str:
    """``page`` with the text between its markers replaced by ``text``."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise SystemExit(f"common_mistakes: {PAGE.relative_to(ROOT)} needs the markers {BEGIN!r} and {END!r}, "
                         f"once each, in that order")
    return page[:page.index(BEGIN)] + text + page[page.index(END) + len(END):]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs; write nothing")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    new = with_section(page, section(graded(planted_mistakes())))
    if args.check:
        if new != page:
            print(f"{PAGE.relative_to(ROOT)}: the common mistakes are out of date: run python tools/common_mistakes.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    print(f"{PAGE.relative_to(ROOT)}: common mistakes written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
