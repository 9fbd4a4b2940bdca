"""Exercises 13 (ZeRO-3 prefetch under a dynamic graph) and 14 (interleaved 1F1B): each solution passes, and
planted wrong answers — each a small edit of the solution — fail the check that names the mistake, in words a
learner can act on.

One launch per exercise: the solution and every wrong answer run their scenarios one after another inside the
same two gloo ranks (:func:`_measure_all`), each under the grader's probe with the grader's seed, then
``zerokit.grade`` judges each submission from those measurements exactly as ``zerokit grade`` does (its
``run_scenario`` looked up instead of launched). ``tests/grade/test_grade.py`` grades both solutions the ordinary
way and checks the untouched exercises, the generated files and the solution notebooks, as for every exercise.
"""
from __future__ import annotations

import traceback

import pytest
import torch

import zerokit
from zerokit.grade import core, grade, loader
from zerokit.grade.exercises import get
from zerokit.runtime.errors import RankFailed

from planted import SOLUTIONS, planted, solution


# --- the wrong answers: (name, edits of the solution, the check that must fail, words its message must hold) ---

_NEXT = """        k = len(seen) - 1
        if k >= len(trace) or trace[k] != i:
            self.recorded[phase] = None
            self.invalidations += 1
            return None
        return trace[k + 1] if k + 1 < len(trace) else None
"""
_BY_INDEX = """        if i not in trace:
            return None
        k = trace.index(i)
        return trace[k + 1] if k + 1 < len(trace) else None
"""

WRONG = {
    "13_zero3_prefetch": [
        ("a prefetched unit gathered again on demand",
         [("        if not self.is_gathered(i):\n            self.gather(i)\n", "        self.gather(i)\n")],
         "gathered-once", "gathered 2 times in step 1's forward — it was prefetched already"),
        ("a prefetched unit used before its gather was waited for",
         [("        self.wait(i)\n        if ahead", "        if ahead")],
         "same-as-one-process", "still in flight (never waited for)"),
        ("the first step's trace trusted for ever (looked up by unit, never invalidated, never re-recorded)",
         [(_NEXT, _BY_INDEX), ("            if seen:\n", "            if seen and self.recorded[phase] is None:\n")],
         "gathered-once", "an old trace is still trusted"),
        ("the trace invalidated but never recorded again",
         [("            if seen:\n", "            if seen and not self.invalidations:\n")],
         "prefetched-ahead", "the branch changed in step 2"),
    ],
    "14_interleaved_1f1b": [
        ("1F1B's warm-up, p − 1 − r forwards",
         [("    warmup = min((v - 1) * p + 2 * (p - 1 - r), v * m)\n", "    warmup = min(p - 1 - r, v * m)\n")],
         "forward-before-backward", "before its forward"),
        ("backwards in chunk order, not reversed",
         [("for first in range(0, m, p) for c in reversed(range(v)) for k in range(p)]",
           "for first in range(0, m, p) for c in range(v) for k in range(p)]")],
         "no-deadlock", "deadlocks"),
        ("a rank's chunks as consecutive stages",
         [("    return c * p + r\n", "    return r * p + c\n")],
         "chunks-on-ranks", "stage 1 lives on rank 1"),
        ("every forward before any backward",
         [("    warmup = min((v - 1) * p + 2 * (p - 1 - r), v * m)\n", "    warmup = v * m\n")],
         "peak-in-flight", "GPipe's order over the chunks"),
    ],
}


def _edited(key: str, edits) -> str:
    return planted(solution(key), edits, key)


def _measure_all(exercise, namespaces: list) -> list:
    """Every scenario of ``exercise`` for every namespace, in one launch: per namespace {scenario: outcome}."""
    world = max(s.world_size for s in exercise.scenarios.values())

    def rank(ctx):
        from zerokit.grade import probe as probes

        probe = probes.install()
        out = []
        for ns in namespaces:
            row = {}
            for name, scenario in exercise.scenarios.items():
                if ctx.rank >= scenario.world_size:
                    continue
                probe.reset()
                torch.manual_seed(0)
                try:
                    row[name] = ("ok", scenario.fn(ctx, ns, probe))
                except Exception:  # noqa: BLE001 - reported as a rank failure, the way core reports a failed launch
                    row[name] = ("raised", traceback.format_exc())
            out.append(row)
        return out

    per_rank = zerokit.launch(rank, world, backend="gloo", timeout_s=120)
    outcomes = []
    for k in range(len(namespaces)):
        row = {}
        for name, scenario in exercise.scenarios.items():
            results = [per_rank[r][k][name] for r in range(scenario.world_size)]
            failed = [(r, text) for r, (kind, text) in enumerate(results) if kind == "raised"]
            row[name] = (core.from_rank_failed(RankFailed(failed[0][0], failed[0][1])) if failed
                         else [value for _, value in results])
        outcomes.append(row)
    return outcomes


def _reports(key: str, tmp_path_factory) -> dict:
    """{"solution" or a wrong answer's name: its GradeReport}, from one shared launch."""
    folder = tmp_path_factory.mktemp(key)
    names, namespaces = ["solution"], [loader.load_path(SOLUTIONS / f"{key}.py")]
    for what, edits, _, _ in WRONG[key]:
        path = folder / f"{len(names):02d}_{key}.py"
        path.write_text(_edited(key, edits))
        names.append(what)
        namespaces.append(loader.load_path(path))
    exercise = get(key)
    outcomes = {id(ns): row for ns, row in zip(namespaces, _measure_all(exercise, namespaces))}
    real = core.run_scenario
    core.run_scenario = lambda scenario, ns, timeout_s=None: outcomes[id(ns)][scenario.name]
    try:
        return {name: grade(ns, key) for name, ns in zip(names, namespaces)}
    finally:
        core.run_scenario = real


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    cache: dict = {}

    def get_reports(key: str) -> dict:
        if key not in cache:
            cache[key] = _reports(key, tmp_path_factory)
        return cache[key]

    return get_reports


@pytest.mark.parametrize("key", list(WRONG))
def test_solution_passes_every_check(reports, key):
    report = reports(key)["solution"]
    assert report.passed, report.text()
    assert report.points == report.max_points == get(key).max_points


CASES = [(key, what, check, words) for key, rows in WRONG.items() for what, _, check, words in rows]


@pytest.mark.parametrize("key, what, check, words", CASES, ids=[f"{c[0][:2]}-{c[1]}" for c in CASES])
def test_wrong_answer_is_named(reports, key, what, check, words):
    report = reports(key)[what]
    result = report.result(check)
    assert not result.passed, f"{what}: {report.text()}"
    assert words in result.detail, f"{what}: {result.detail}"
    assert result.hint and report.exit_status == 1


def test_the_shared_launch_reports_a_rank_failure_as_the_grader_does(reports):
    """A wrong answer stopped by the probe inside the ranks reads the same as under a launch of its own."""
    result = reports("13_zero3_prefetch")["a prefetched unit used before its gather was waited for"].results
    assert result[0].detail.startswith("rank ") and "wait(i)" in result[0].hint
    assert all("not judged: the run stopped first (used-in-flight" in r.detail for r in result[1:])
