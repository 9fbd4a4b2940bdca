"""Planted wrong answers, shared by the graders' tests: a solution with small edits, each edit's text found exactly
once; the variants loaded as submissions, graded on shared ranks (one launch per scenario, every rank running the
scenario on each submission in turn, as ``zerokit.grade.core`` does for one; a scenario without ranks runs on
each in this process); a right answer passing every check and
each wrong one failing the check that names it, in a learner's words, with a hint."""
from __future__ import annotations

import re
from pathlib import Path

from zerokit.grade import core, loader
from zerokit.grade.exercises import get
from zerokit.runtime.launch import launch

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


def solution(key: str) -> str:
    return (SOLUTIONS / f"{key}.py").read_text()


def planted(source: str, edits, label: str) -> str:
    """``source`` with each (old, new) edit made: ``old`` replaced where it stands exactly once (an edit that matches
    nothing, or more than once, is a broken test), or ``new`` appended when ``old`` is empty."""
    text = source
    for old, new in edits:
        if not old:  # appended
            text += new
            continue
        assert text.count(old) == 1, f"{label}: the edit's text {old[:60]!r} is not in the solution exactly once"
        text = text.replace(old, new)
    return text


def stubbed(source: str, name: str, label: str = "") -> str:
    """``source`` with the solution block of the function (or method) ``name`` — the first block after its ``def`` —
    left as the exercise leaves it: ``raise NotImplementedError(what to write)``, the rest of the solution kept."""
    lines = source.splitlines(True)
    start = next((i for i, line in enumerate(lines) if re.match(rf"\s*def {re.escape(name)}\(", line)), None)
    assert start is not None, f"{label}: no def {name} in the solution"
    begin = next(i for i in range(start, len(lines)) if "# BEGIN SOLUTION" in lines[i])
    end = next(i for i in range(begin, len(lines)) if "# END SOLUTION" in lines[i])
    indent, what = re.match(r"(\s*)# BEGIN SOLUTION(?::\s*(.*))?$", lines[begin].rstrip("\n")).groups()
    return "".join(lines[:begin] + [f"{indent}raise NotImplementedError({(what or '').strip()!r})\n"] + lines[end + 1:])


def load_variants(folder: Path, key: str, variants: dict) -> dict:
    """{name: source} written as ``folder/<i>/<key>.py`` and loaded: {name: namespace}."""
    namespaces = {}
    for i, (name, text) in enumerate(variants.items()):
        path = folder / str(i) / f"{key}.py"
        path.parent.mkdir()
        path.write_text(text)
        namespaces[name] = loader.load_path(path)
    return namespaces


def grade_on_shared_ranks(key: str, namespaces: dict) -> dict:
    """{submission: {check: CheckResult}} for every namespace, one launch per scenario."""
    spec = get(key)
    outcomes = {name: {} for name in namespaces}
    for scenario in spec.scenarios.values():
        if scenario.world_size == 0:  # no ranks: it runs where the submission's code does, here
            for name, ns in namespaces.items():
                outcomes[name][scenario.name] = core.run_scenario(scenario, ns)
            continue
        by_rank = launch(core.each_on_the_same_ranks, scenario.world_size, scenario.fn, namespaces,
                         backend="gloo", timeout_s=60)
        for name in namespaces:
            outcomes[name][scenario.name] = [r[name] for r in by_rank]
    return {name: {c.name: core._judge(c, outcomes[name].get(c.scenario), ns, None) for c in spec.checks}
            for name, ns in namespaces.items()}


def assert_passes(graded: dict, right: str, label: str = "") -> None:
    failed = {name: r.detail for name, r in graded[right].items() if not r.passed}
    assert not failed, f"{label}the {right} fails {failed}"


def assert_each_named(graded: dict, wrong: dict, label: str = "") -> None:
    """``wrong``: {what: (edits, the check that must fail, words its message holds)}."""
    for what, (_, check, words) in wrong.items():
        result = graded[what][check]
        assert not result.passed, f"{label}{what}: {check} passed"
        assert words in result.detail, f"{label}{what}: {result.detail}"
        assert result.hint, f"{label}{what}: no hint"
