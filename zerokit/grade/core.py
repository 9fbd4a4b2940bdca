"""Exercises, their scenarios and checks, and the run that grades a submission against them.

Lifecycle of one grading (:func:`run`, in two halves that may run in two processes):

1. every name the exercise needs is looked up in the submission's namespace; a missing
   one fails every check with a message that names it;
2. :func:`measure` — where the submission's code runs: each *scenario* — a function run on ``world_size`` gloo ranks through
   :func:`zerokit.launch`, with a timeout, that drives the learner's code under the
   :mod:`.probe` and returns its measurements — runs once, the first time a check needs it;
   a rank that raises or hangs becomes a :class:`ScenarioError` that says what happened
   in a learner's words (not implemented yet, which rank raised what at which line of
   theirs, a rank that skipped a collective its peers called, a hang and where each rank
   waited, a mistake the probe caught). A pure function of the learner's is checked on its own,
   by a scenario without ranks that calls it (:func:`learner_call`), so that a function still
   unwritten fails only the checks that need it, each naming it (a method with its class);
3. :func:`verdicts` — in the grader's process, where the submission's code never ran
   (:mod:`.isolate` hands it the measurements as plain data): each *check* judges the
   measurements of its scenario against the single-process reference and
   :mod:`zerokit.theory`: it returns a line saying what matched, or raises :class:`Fail`
   with expected vs measured, the rank, and a hint that names the concept (the check's own
   ``concept`` unless the judge recognised a mistake). A judge reads the submission's
   namespace only for the plain values the exercise names in ``answers``; whatever calls the
   learner's functions is a scenario.

Nothing here raises at the learner: every outcome becomes a :class:`CheckResult`, whose
``kind`` says why it failed (a gradebook's status: :mod:`.gradebook`).
"""
from __future__ import annotations

import linecache
import re
import traceback
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from ..runtime.errors import RankFailed, RankTimeout
from ..runtime.launch import launch
from . import probe as probe_module, probe

#: seconds a scenario may run before it is reported as a hang
DEFAULT_TIMEOUT_S = 60.0


class Fail(Exception):
    """A check's verdict: what is wrong, expected vs measured, on which rank, and a hint.

    ``kind``: None for a wrong answer; "not-implemented" when the learner's code still raises
    NotImplementedError (a check judged on a call of theirs)."""

    def __init__(self, message: str, expected=None, measured=None, rank: Optional[int] = None,
                 hint: Optional[str] = None, kind: Optional[str] = None):
        super().__init__(message)
        self.message, self.expected, self.measured, self.rank, self.hint = message, expected, measured, rank, hint
        self.kind = kind


@dataclass
class Scenario:
    """``fn(ctx, ns, probe)`` on ``world_size`` ranks; returns each rank's measurements (plain data: numbers,
    strings, tensors, and lists, tuples and dicts of them — what crosses to the grader's process, :mod:`.wire`).

    ``world_size`` 0: ``fn(None, ns, None)`` runs in the submission's process itself — for a
    scenario that launches ranks itself (``zerokit.train``, which has its own timeout), or
    that calls the learner's functions directly. Its ``timeout_s`` is then not a launch's:
    it bounds the submission's process while the scenario runs (``--timeout`` leaves it be).
    """

    name: str
    world_size: int
    fn: Callable
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class Check:
    """One graded property: ``judge(results_by_rank, ns)`` returns a line or raises :class:`Fail`.

    ``catches``: the probe's mistake kinds (and "hang") that belong to this check when the
    scenario stops on one. ``scenario`` None: judged without running anything.
    """

    name: str
    points: int
    scenario: Optional[str]
    judge: Callable
    concept: str
    catches: Sequence[str] = ()
    #: ``requires(ns)`` -> a message when the submission is not ready for this check (its scenario is then not run)
    requires: Optional[Callable] = None


@dataclass
class Exercise:
    key: str
    title: str
    minutes: int
    needs: Sequence[str]
    scenarios: Dict[str, Scenario]
    checks: List[Check]
    #: from the concept to the code: the first names the concept in words, the next narrow down, only the last shows
    #: code (:func:`zerokit.grade.hint` unfolds them one at a time)
    hints: List[str] = field(default_factory=list)
    #: names of plain values (numbers, strings) in the submission that the checks read in the grader's process
    answers: Sequence[str] = ()

    @property
    def number(self) -> str:
        return self.key[:2]

    @property
    def max_points(self) -> int:
        return sum(c.points for c in self.checks)


@dataclass
class CheckResult:
    name: str
    points: int
    passed: bool
    detail: str
    expected: object = None
    measured: object = None
    rank: Optional[int] = None
    hint: Optional[str] = None
    #: why a failed check failed: None (a wrong answer), "not-implemented", "not-answered", "missing-name",
    #: "unreadable" (measurements the judge could not read), "load-error", "load-hang", "crashed", or the
    #: :class:`ScenarioError` kind of the run it needed ("error", "hang", a probe mistake)
    kind: Optional[str] = None

    @property
    def earned(self) -> int:
        return self.points if self.passed else 0


@dataclass
class ScenarioError:
    """Why a scenario produced no measurements: ``kind`` is not-implemented, error, hang or a probe mistake."""

    kind: str
    message: str
    rank: Optional[int] = None


# --- turning a failed launch into a learner's message ------------------------------------------

_MISTAKE = re.compile(r"Mistake: \[([\w-]+)\] (.*)$")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
_LIBRARY = ("/torch/", "/zerokit/", "/multiprocessing/", "/python3.", "/site-packages/", "<frozen")


def _qualified(file: str, number: int, func: str) -> str:
    """``Class.func`` when ``func`` at line ``number`` of ``file`` is a method (read from :mod:`linecache`, where
    the loader registers a notebook's cells), else ``func`` — so that a ``forward`` says whose."""
    lines = linecache.getlines(file)
    indent = None
    for line in reversed(lines[:number]):
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        depth = len(line) - len(stripped)
        if indent is None:
            if re.match(rf"(?:async\s+)?def {re.escape(func)}\b", stripped):
                indent = depth
        elif depth < indent:
            enclosing = re.match(r"class (\w+)", stripped)
            return f"{enclosing.group(1)}.{func}" if enclosing else func
    return func


def learner_frame(traceback_text: str, with_code: bool = True) -> str:
    """``"func (code cell K, line N): code"`` for the deepest frame of the learner's own code, or ''; a method is
    named with its class (``Class.func``) where the source is at hand."""
    lines = traceback_text.splitlines()
    found = ""
    for i, line in enumerate(lines):
        match = _FRAME.match(line)
        if match and not any(part in match.group(1) for part in _LIBRARY):
            file, number, func = match.groups()
            cell = re.match(r"<.* cell (\d+)>$", file)
            place = f"code cell {cell.group(1)}, line {number}" if cell else f"{file.rsplit('/', 1)[-1]}, line {number}"
            code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
            found = f"{_qualified(file, int(number), func)} ({place})" + (f": {code}" if code and with_code else "")
    return found


_PEER_LOSS = ("connection closed by peer", "connection reset", "broken pipe", "without raising")
_RETURNED = re.compile(r"(ranks? [\d, ]+?) returned while (ranks? [\d, ]+?) still waited in a collective")
_AT_CALL = re.compile(r"(?:^|; )(rank (\d+) is|ranks ([\d, ]+) are) (?:dead; it was )?in (\w+ of [\d,]+ B) "
                      r"\(grader's call #(\d+)\)")


def _collectives_disagree(e: RankFailed) -> Optional[ScenarioError]:
    """When the failure is only a peer's loss (a connection closed, a rank aborted by gloo), whether the ranks
    called different collectives — one rank returned while another waited (the error is the returned rank's), or
    two ranks at the same call of the probe in different collectives — said in a learner's words; None otherwise."""
    if not any(sign in e.traceback.lower() for sign in _PEER_LOSS) or not e.where:
        return None
    at = {}
    for match in _AT_CALL.finditer(e.where):
        ranks = [int(match.group(2))] if match.group(2) else [int(r) for r in match.group(3).split(",")]
        for rank in ranks:
            at[rank] = (int(match.group(5)), match.group(4))
    returned = _RETURNED.search(e.where)
    if returned:
        skipped, waiting = returned.groups()
        after = re.search(rf"{skipped} (?:is|are) finished \(fn returned after (\d+) collectives?\)", e.where)
        count = f" after {after.group(1)} collective{'' if after.group(1) == '1' else 's'}" if after else ""
        first = int(re.search(r"\d+", waiting).group(0))
        what = f" in {at[first][1]} (the grader's call #{at[first][0]})" if first in at else " in a collective"
        return ScenarioError("error", f"{skipped} skipped a collective that {waiting} called: {skipped} returned"
                                      f"{count} while {waiting} waited{what}. Every rank must make the same collective "
                                      f"calls in the same order — is one under `if rank == …`, or in a loop that "
                                      f"runs a different number of times on one rank?",
                             int(re.search(r"\d+", skipped).group(0)))
    by_call: Dict[int, Dict[str, List[int]]] = {}
    for rank, (call, what) in sorted(at.items()):
        by_call.setdefault(call, {}).setdefault(what, []).append(rank)
    for call, whats in sorted(by_call.items()):
        if len(whats) > 1:
            parts = "; ".join(f"{'rank' if len(r) == 1 else 'ranks'} {', '.join(map(str, r))} in {w}"
                              for w, r in whats.items())
            return ScenarioError("error", f"the ranks called different collectives at the grader's call #{call}: "
                                          f"{parts}. One rank skipped a collective, or called them in another order "
                                          f"— every rank must make the same collective calls in the same order",
                                 e.rank)
    return None


def not_implemented(traceback_text: str, what: str) -> str:
    """A NotImplementedError in a learner's words: which of their functions is still unwritten, where, and what
    its stub says to write."""
    where = learner_frame(traceback_text, with_code=False) or "your code"
    return f"not implemented yet — {where} still raises NotImplementedError: {what.strip() or 'write this part'}"


def learner_call(fn, *args) -> dict:
    """One call of a learner's function in the submission's process, for a scenario that checks a pure function on
    its own (so that another function still unwritten fails only the checks that need it): ``{"value": ...}``, or
    what it raised — ``{"not-implemented": the words :func:`not_implemented` uses}`` or ``{"raised": ...}``."""
    try:
        return {"value": fn(*args)}
    except NotImplementedError as e:
        return {"not-implemented": not_implemented("".join(traceback.format_exception(e)), str(e))}
    except Exception as e:  # noqa: BLE001 - the learner's code raised: the check says what and where
        where = learner_frame("".join(traceback.format_exception(e)))
        return {"raised": f"{type(e).__name__}: {e}" + (f" in {where}" if where else "")}


def learner_answer(outcome: dict, what: str):
    """The value a :func:`learner_call` returned, or a :class:`Fail` saying what it raised (``what``: the call, as the
    learner would write it)."""
    if "not-implemented" in outcome:
        raise Fail(outcome["not-implemented"], kind="not-implemented")
    if "raised" in outcome:
        raise Fail(f"{what} raised {outcome['raised']}")
    return outcome["value"]


def from_rank_failed(e: RankFailed) -> ScenarioError:
    lines = [line for line in e.traceback.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "the rank died without a traceback"
    mistake = _MISTAKE.search(last)
    if mistake:
        return ScenarioError(mistake.group(1), f"rank {e.rank}: {mistake.group(2)}", e.rank)
    if last.startswith("NotImplementedError"):
        return ScenarioError("not-implemented", not_implemented(e.traceback, last.partition(":")[2]), e.rank)
    disagree = _collectives_disagree(e)
    if disagree:
        return disagree
    where = learner_frame(e.traceback)
    at = f" in {where}" if where else ""
    code = f" (exit code {e.exitcode})" if e.exitcode is not None and not lines else ""
    return ScenarioError("error", f"rank {e.rank} raised {last}{at}{code}", e.rank)


def _names(ranks: List[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def from_timeout(e: RankTimeout, world_size: int) -> ScenarioError:
    """A hang in a few lines: the ranks grouped by the collective each last entered (their stacks stay in the
    submission's output)."""
    groups: Dict[str, List[int]] = {}
    for r in e.ranks:
        groups.setdefault(e.last_collectives.get(r) or "no collective", []).append(r)
    waits = "; ".join(f"{_names(ranks)} last entered {what}" for what, ranks in groups.items())
    return ScenarioError("hang", f"the run on {world_size} ranks did not finish in {e.timeout_s:g} s — a hang: "
                                 f"{waits}. Ranks wait for each other: a receive no rank sends, a send no "
                                 f"rank receives, or a collective that one rank skips or calls in another order")


# --- the run -------------------------------------------------------------------------------------

def grader_conditions() -> None:
    """What every scenario starts from, whatever the submission's code left set in its process: seed 0, float32 as
    torch's default dtype, autograd on (a notebook's leftover ``torch.set_default_dtype(torch.float64)`` would
    otherwise build the grader's model in float64)."""
    import torch

    torch.manual_seed(0)
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)


def _rank_entry(ctx, fn, ns):
    """What every rank runs: the grader's conditions, the probe installed, then the scenario."""
    grader_conditions()
    return fn(ctx, ns, probe.install())


def each_on_the_same_ranks(ctx, fn, namespaces: Dict[str, dict]) -> Dict[str, object]:
    """What every rank runs to grade several submissions in one launch (a class's, or planted wrong answers): the
    scenario on each in turn, each under the grader's conditions with a fresh probe, as :func:`_rank_entry` does
    for one.
    Only for submissions that cannot error or hang: one that does takes the others' results with it."""
    probe = probe_module.install()
    out = {}
    for name, ns in namespaces.items():
        grader_conditions()
        probe.reset()
        out[name] = fn(ctx, ns, probe)
    return out


def run_scenario(scenario: Scenario, ns: dict, timeout_s: Optional[float] = None):
    """The scenario's measurements by rank, or a :class:`ScenarioError`."""
    if scenario.world_size == 0:
        try:
            grader_conditions()
            return scenario.fn(None, ns, None)
        except NotImplementedError as e:
            return ScenarioError("not-implemented", not_implemented("".join(traceback.format_exception(e)), str(e)))
        except BaseException as e:  # noqa: BLE001 - SystemExit too: the measurement broke, a check says so
            first = str(e).splitlines()[0] if str(e) else ""
            return ScenarioError("error", f"the measured run failed: {type(e).__name__}: {first}")
    try:
        return launch(_rank_entry, scenario.world_size, scenario.fn, ns, backend="gloo",
                      timeout_s=timeout_s or scenario.timeout_s)
    except RankFailed as e:
        return from_rank_failed(e)
    except RankTimeout as e:
        return from_timeout(e, scenario.world_size)


def _judge(check: Check, outcome, ns: dict, owner: Optional[str]) -> CheckResult:
    """``owner``: the check a scenario error is reported on (the others say they were not judged)."""
    if isinstance(outcome, ScenarioError):
        if outcome.kind == "not-implemented" or check.name == owner:
            generic = outcome.kind in ("error", "hang") and outcome.kind not in check.catches
            hint = "fix this first: the checks need a run that finishes" if generic else check.concept
            return CheckResult(check.name, check.points, False, outcome.message, rank=outcome.rank, hint=hint,
                               kind=outcome.kind)
        return CheckResult(check.name, check.points, False,
                           f"not judged: the run stopped first ({outcome.kind}; see {owner!r})", rank=outcome.rank,
                           kind=outcome.kind)
    try:
        detail = check.judge(outcome, ns)
    except Fail as f:
        return CheckResult(check.name, check.points, False, f.message, f.expected, f.measured, f.rank,
                           f.hint or check.concept, kind=f.kind)
    except Exception as e:  # noqa: BLE001 - a measurement the judge could not read: report it, never raise
        return CheckResult(check.name, check.points, False,
                           f"could not judge the measurements ({type(e).__name__}: {e}); does your code return "
                           f"what the interface says?", hint=check.concept, kind="unreadable")
    return CheckResult(check.name, check.points, True, detail or "as expected")


def _owner(checks: Sequence[Check], scenario: str, kind: str) -> Optional[str]:
    """The check that reports a scenario's error: the first that catches its kind, else the scenario's first."""
    mine = [c for c in checks if c.scenario == scenario]
    for c in mine:
        if kind in c.catches:
            return c.name
    return mine[0].name if mine else None


def select(exercise: Exercise, only: Optional[Sequence[str]] = None) -> List[Check]:
    """The checks of ``exercise`` named in ``only`` (all of them for None), in order; an unknown name raises."""
    unknown = set(only or ()) - {c.name for c in exercise.checks}
    if unknown:
        raise ValueError(f"exercise {exercise.key} has no check {sorted(unknown)}; its checks: "
                         f"{', '.join(c.name for c in exercise.checks)}")
    return [c for c in exercise.checks if only is None or c.name in only]


def missing(exercise: Exercise, ns) -> Optional[str]:
    """The message every check fails with when the submission defines not every name the exercise needs."""
    absent = [name for name in exercise.needs if name not in ns]
    if not absent:
        return None
    return (f"the submission defines no {', '.join(map(repr, absent))}: keep the cell that defines "
            f"{'it' if len(absent) == 1 else 'them'}, under the name the interface gives")


def _waiting(check: Check, ns) -> Optional[str]:
    return check.requires(ns) if check.requires is not None else None


def measure(exercise: Exercise, checks: Sequence[Check], ns: dict, timeout_s: Optional[float] = None) -> dict:
    """Where the submission's code runs: ``{scenario: measurements or ScenarioError}`` for every scenario the
    checks need, each run once (none when a name is missing; none for a check whose ``requires`` says wait)."""
    outcomes: dict = {}
    if missing(exercise, ns):
        return outcomes
    for c in checks:
        if c.scenario is not None and c.scenario not in outcomes and not _waiting(c, ns):
            outcomes[c.scenario] = run_scenario(exercise.scenarios[c.scenario], ns, timeout_s)
    return outcomes


def verdicts(exercise: Exercise, checks: Sequence[Check], ns, outcomes: dict) -> List[CheckResult]:
    """Each check judged on its scenario's measurements, in order. ``ns``: the namespace, or in the grader's
    process the plain values it holds (:mod:`.wire`); a scenario with no measurements is an error."""
    message = missing(exercise, ns)
    if message:
        return [CheckResult(c.name, c.points, False, message, kind="missing-name") for c in checks]
    results = []
    shown: Dict[str, str] = {}
    for c in checks:
        outcome = None
        waiting = _waiting(c, ns)
        if waiting:
            kind = "not-answered" if waiting.startswith("not answered") else None
            results.append(CheckResult(c.name, c.points, False, waiting, hint=c.concept, kind=kind))
            continue
        if c.scenario is not None:
            outcome = outcomes.get(c.scenario)
            if outcome is None:
                outcome = ScenarioError("error", f"the run {c.scenario!r} brought back no measurements")
        owner = _owner(checks, c.scenario, outcome.kind) if isinstance(outcome, ScenarioError) else None
        result = _judge(c, outcome, ns, owner)
        if not result.passed and result.kind == "not-implemented":
            said = result.detail
            if said in shown:  # said once is enough
                result.detail = f"not implemented yet (see {shown[said]!r})"
            shown.setdefault(said, c.name)
        results.append(result)
    return results


def run(exercise: Exercise, ns: dict, only: Optional[Sequence[str]] = None,
        timeout_s: Optional[float] = None) -> List[CheckResult]:
    """Grade ``ns`` on every check of ``exercise`` (or those named in ``only``), in order, in this process."""
    checks = select(exercise, only)
    return verdicts(exercise, checks, ns, measure(exercise, checks, ns, timeout_s))
