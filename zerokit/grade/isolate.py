"""Grade each submission in a process of its own: what its code does there stays there.

Lifecycle of :func:`grade_paths`, in the grader's process:

1. before any process starts, torch's compiler stack and each exercise's module are imported
   here once, so that every process forked from here has them (a fork costs milliseconds, a
   fresh interpreter seconds);
2. per submission, up to ``jobs`` at a time, a *keeper* process starts (forked, or spawned
   where :func:`zerokit.launch` would not fork: outside Linux, or once this process holds a
   process group or CUDA). The keeper leads a session of its own, becomes the subreaper of
   everything below it (Linux), takes SIGTERM as "kill the submission's process, then everything
   it left" — Linux sends it when the grader dies, however hard (PDEATHSIG, so no keeper outlives
   the grader, nor what it keeps) — and forks the *submission's process*, which
   leads a process group of its own, points every inherited descriptor but its pipe (another
   submission's pipe, the grader's files) at /dev/null and fd 1 and 2 at a file (what the
   learner's code and its ranks print; a report keeps the last lines), loads the notebook
   within the load limit (``timeout_s``, else
   :data:`.loader.LOAD_TIMEOUT_S`), says which exercise it answers, measures
   (:func:`.core.measure`: the scenarios on gloo ranks launched from there), sends the
   measurements as plain data (:mod:`.wire`) and leaves by ``os._exit`` — a ``SystemExit`` or any
   other exception on the way is caught and sent instead. The keeper waits for it, then kills
   what it left running — what it started, and what those started, reparented to the keeper —
   reaps it all, says how the submission's process ended and exits;
3. the grader waits on every pipe and keeper at once, each submission under a deadline (the
   load limit, then the exercise's scenario timeouts, each with a margin): past it the keeper is
   told to kill everything (SIGTERM), and is killed if it does not. However the grader's loop
   ends — an exception, Ctrl-C, SIGTERM or SIGHUP (raised as
   :class:`~zerokit.runtime.termination.Terminated` inside
   :func:`~zerokit.runtime.termination.unwinding`, as a launch does) — every keeper is told at
   once, waited for within ``KILL_GRACE_S`` and killed past it, and only then does the grader
   end (by the signal, re-sent);
4. its measurements are read (weights-only) and judged here as soon as they arrive, while the
   keeper cleans up (:func:`.core.verdicts`, against references computed here); the grading is
   over when the keeper has exited. What a submission's code did in
   its process — ``sys.exit()``, a default dtype, the grader's functions replaced, processes
   started and left — reaches neither its verdict nor another submission's.

What stays open: the measurements are the submission's process's word. A learner who rewrites the
grader inside their own process can send any numbers; the verdicts are still computed here, so
they pass only when the numbers are the ones a right answer gives.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from ..runtime.launch import _choose_start_method
from ..runtime.spawn import die_with_parent, main_module_hidden, own_session
from ..runtime.termination import unwinding
from . import core, loader, wire
from .core import CheckResult
from .exercises import get, KEYS
from .report import GradeReport

#: the margin on a submission's deadline while it loads (the loader's own alarm comes first)
LOAD_MARGIN_S = 15.0
#: the margin on each scenario's timeout (a hung launch prints stacks, stops and reaps its ranks) ...
SCENARIO_MARGIN_S = 15.0
#: ... and on the whole measuring (sending the measurements, the keeper's clean-up)
MEASURE_MARGIN_S = 30.0
#: how long a spawned keeper may take to start (a fresh interpreter imports torch)
SPAWN_START_S = 60.0
#: how long a keeper told to stop (SIGTERM) has before it is killed
KILL_GRACE_S = 10.0
#: how long a keeper keeps killing what a submission left running (a process may fork while it is killed)
CLEAN_UP_S = 10.0
#: the most a submission's process may send back
MAX_RESULT_BYTES = 256 << 20
#: the most of a submission's output a report keeps (its last lines)
OUTPUT_LINES, OUTPUT_CHARS = 40, 4000
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Job:
    """One submission to grade: the file, the exercise (None: from the submission), the checks (None: all)."""

    path: Path
    exercise: Optional[str] = None
    checks: Optional[Sequence[str]] = None


# --- the submission's process and its keeper ----------------------------------------------------------------

def _point_output_at(path: str) -> None:
    """fd 1 and 2 to the file at ``path``; Python's streams rebuilt on them (a fork keeps the grader's)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)


def _seal_descriptors(keep: set) -> None:
    """Point every inherited descriptor but ``keep`` at /dev/null: the submission reaches neither another's pipe nor
    the grader's files. Not closed: a file object of the grader's that still holds one (a logging handler's
    capture file, say) would write into whatever later took its number — a rank's shared status slot."""
    try:
        inherited = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        inherited = list(range(3, min(os.sysconf("SC_OPEN_MAX"), 4096)))
    null = os.open(os.devnull, os.O_RDWR)
    for fd in inherited:
        if fd not in keep and fd != null:
            with contextlib.suppress(OSError):
                os.fstat(fd)
                os.dup2(null, fd)
    os.close(null)


def _measure(job: Job, timeout_s: Optional[float], announce) -> dict:
    """In the submission's process: load it, find its exercise, run the scenarios; everything as plain data."""
    sent: dict = {"key": None, "load_error": None, "load_timed_out": False, "key_error": None,
                  "facts": {}, "outcomes": {}}
    ns = None
    try:
        ns = loader.load_path(job.path, timeout_s)
    except loader.LoadError as e:
        sent["load_error"], sent["load_timed_out"] = str(e), e.timed_out
    key = job.exercise or loader.exercise_key(job.path, ns)
    sent["key"] = key
    announce(key or "")
    if key is None or ns is None:
        return sent
    try:
        spec = get(key)
        checks = core.select(spec, job.checks)
    except ValueError as e:
        sent["key_error"] = str(e)
        return sent
    outcomes = core.measure(spec, checks, ns, timeout_s)
    sent["facts"] = wire.facts(ns, spec.needs, spec.answers)
    sent["outcomes"] = {name: wire.outcome(value) for name, value in outcomes.items()}
    return sent


def _encode_checked(sent: dict) -> bytes:
    """The measurements encoded; a scenario whose measurements the grader could not read becomes an error."""
    for name, value in list(sent["outcomes"].items()):
        try:
            wire.decode(wire.encode(value))
        except Exception as e:  # noqa: BLE001 - what a learner's code returned: say so, judge the rest
            sent["outcomes"][name] = wire.outcome(core.ScenarioError(
                "error", f"the run returned something the grader cannot read ({type(e).__name__}): does your "
                         f"code return what the interface says?"))
    return wire.encode(sent)


def _submission_main(job: Job, timeout_s: Optional[float], conn, output: str) -> None:
    """The submission's process, forked by its keeper; never returns."""
    try:
        die_with_parent(os.getppid())
        os.setpgid(0, 0)  # what it starts is in its group, which the keeper kills (where no subreaper is)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grader takes Ctrl-C
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _seal_descriptors({0, 1, 2, conn.fileno()})
        _point_output_at(output)
        import torch

        torch.set_num_threads(1)  # as a rank's: a fork's OpenMP pool is not the parent's
        try:
            sent = _measure(job, timeout_s, lambda key: conn.send_bytes(b"L" + key.encode()))
            data = b"R" + _encode_checked(sent)
        except BaseException:  # noqa: BLE001 - SystemExit too: the grader hears how it ended
            data = b"R" + wire.encode({"crash": traceback.format_exc(limit=-4)})
        sys.stdout.flush()  # all of its output is in the file before the grader reads it, on the measurements
        sys.stderr.flush()
        conn.send_bytes(data)
    finally:
        os._exit(0)


def _children() -> List[int]:
    """The pids of this process's children (its own and those reparented to it): Linux's list of them, else from
    every process's parent in /proc."""
    me = os.getpid()
    with contextlib.suppress(OSError, ValueError):
        with open(f"/proc/{me}/task/{me}/children") as f:  # one thread here: its children are the process's
            return [int(pid) for pid in f.read().split()]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[1] == str(me).encode():
            found.append(int(entry))
    return found


def _reap() -> bool:
    """Reap every child that has exited; True when the keeper has no child left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def _end_descendants(child: int, subreaper: bool) -> None:
    """Kill and reap everything below the keeper, up to ``CLEAN_UP_S``: with the subreaper, each process whose
    parent is killed comes to the keeper, and is killed in the next round."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child, signal.SIGKILL)  # where the submission's process led a group of its own
    end = time.monotonic() + CLEAN_UP_S
    pause = 0.001
    while True:
        for pid in _children() if subreaper else ():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                if group != os.getpgrp():  # a group of its own (a rank's, say): all of it
                    os.killpg(group, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if _reap() or time.monotonic() >= end:
            return
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


def _keeper_main(job: Job, timeout_s: Optional[float], conn, output: str, grader: int) -> None:
    """The keeper: start the submission's process, wait for it, kill and reap what it left; never returns.

    SIGTERM — the grader's (a deadline passed, the grader is stopping) or Linux's when the grader dies, however
    hard (PDEATHSIG) — kills the submission's process, so the keeper goes on to kill and reap what it left."""
    try:
        own_session()
        keeper, state = os.getpid(), {"child": None, "stop": False}

        def stop(signum, frame):
            if os.getpid() != keeper:  # the submission's process, before it takes the default back
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            state["stop"] = True
            if state["child"] is not None:  # started and not reaped yet: the pid is still its
                with contextlib.suppress(ProcessLookupError):
                    os.kill(state["child"], signal.SIGKILL)

        signal.signal(signal.SIGTERM, stop)
        die_with_parent(grader, signal.SIGTERM)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _point_output_at(output)
        subreaper = sys.platform.startswith("linux")
        if subreaper:
            import ctypes

            subreaper = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0
        if state["stop"]:  # told to stop before anything started
            os._exit(0)
        child = os.fork()
        if child == 0:
            _submission_main(job, timeout_s, conn, output)
        state["child"] = child
        if state["stop"]:  # told while it forked
            os.kill(child, signal.SIGKILL)
        while True:
            try:
                _, status = os.waitpid(child, 0)
                break
            except InterruptedError:
                continue
        state["child"] = None
        _end_descendants(child, subreaper)
        code = os.waitstatus_to_exitcode(status)
        with contextlib.suppress(OSError):
            conn.send_bytes(b"E" + str(code).encode())
    finally:
        os._exit(0)


# --- the grader's side --------------------------------------------------------------------------------------

def _start_method() -> str:
    return _choose_start_method(None, "gloo")


def check_timeout(timeout_s) -> None:
    """``timeout_s`` is None (each exercise's own) or a positive number of seconds; else ``ValueError``."""
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not timeout_s > 0):
        raise ValueError(f"timeout_s={timeout_s!r} must be None (each exercise's own timeouts) or a positive number "
                         f"of seconds")


def _prepare(jobs: Sequence[Job]) -> None:
    """Refuse what is wrong before any process starts (an exercise or a check named that does not exist); import
    here what every submission's process needs, once, before the first fork."""
    import torch._dynamo  # noqa: F401 - see zerokit.runtime.launch._import_before_fork

    for job in jobs:
        if job.exercise is not None:
            core.select(get(job.exercise), job.checks)
            continue
        key = loader.exercise_key(job.path, None)
        with contextlib.suppress(ValueError):
            if key:
                get(key)


def measuring_limit(spec: core.Exercise, timeout_s: Optional[float]) -> float:
    """The longest a submission's process may measure ``spec``: every scenario's timeout with its margin."""
    total = 0.0
    for scenario in spec.scenarios.values():
        limit = scenario.timeout_s if scenario.world_size == 0 else (timeout_s or scenario.timeout_s)
        total += limit + SCENARIO_MARGIN_S
    return total + MEASURE_MARGIN_S


class _Grading:
    """One submission in its processes, from the grader's side."""

    def __init__(self, index: int, job: Job, timeout_s: Optional[float]):
        self.index, self.job, self.timeout_s = index, job, timeout_s
        self.load_limit = timeout_s or loader.LOAD_TIMEOUT_S
        self.key: Optional[str] = None
        self.result: Optional[bytes] = None
        self.exit_code: Optional[int] = None
        self.killed: Optional[str] = None  # why the grader stopped it
        self.kill_at: Optional[float] = None
        self.too_big = False
        self.judged: Optional[GradeReport] = None
        self.done = False

    def start(self, method: str) -> None:
        ctx = mp.get_context(method)
        fd, self.output = tempfile.mkstemp(prefix="zerokit-grade-", suffix=".out")
        os.close(fd)
        self.conn, writer = ctx.Pipe(duplex=False)
        self.keeper = ctx.Process(target=_keeper_main, name=f"zerokit-grade-{self.job.path.name}",
                                  args=(self.job, self.timeout_s, writer, self.output, os.getpid()))
        self.started = time.monotonic()
        try:
            with main_module_hidden() if method == "spawn" else contextlib.nullcontext():
                self.keeper.start()
        finally:
            writer.close()
        self.deadline = self.started + self.load_limit + LOAD_MARGIN_S + (SPAWN_START_S if method == "spawn" else 0)

    def handles(self) -> dict:
        out = {}
        if not self.conn.closed:
            out[self.conn] = self.receive
        if not self.done:
            out[self.keeper.sentinel] = self.on_exit
        return out

    def receive(self) -> None:
        try:
            message = self.conn.recv_bytes(MAX_RESULT_BYTES)
        except EOFError:
            self.conn.close()
            return
        except OSError:  # more than the limit: no result
            self.too_big = True
            self.conn.close()
            return
        tag, body = message[:1], message[1:]
        if tag == b"L" and self.key is None:
            self.key = body.decode("utf-8", "replace")
            try:
                spec = get(self.key)
            except ValueError:
                spec = None
            measuring = measuring_limit(spec, self.timeout_s) if spec is not None else MEASURE_MARGIN_S
            self.deadline = time.monotonic() + measuring
        elif tag == b"R" and self.result is None:
            self.result = body
        elif tag == b"E":
            with contextlib.suppress(ValueError):
                self.exit_code = int(body)

    def on_exit(self) -> None:
        self.keeper.join()
        while not self.conn.closed and self.conn.poll():  # what the keeper and the submission sent last
            self.receive()
        self.conn.close()
        self.done = True

    def expire(self, now: float) -> None:
        """Past the deadline: tell the keeper to kill everything; past the grace too: kill the keeper."""
        if self.kill_at is None:
            loading = self.key is None
            self.killed = (loader.too_long(self.load_limit) if loading else
                           f"the grading did not finish in {now - self.started:.0f} s (the exercise's run "
                           f"timeouts and their margins): stopped, as a hang")
            self.kill_at = now + KILL_GRACE_S
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.keeper.pid, signal.SIGTERM)
        elif now >= self.kill_at:
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(self.keeper.pid, signal.SIGKILL)
            self.kill_at = now + KILL_GRACE_S

    def next_deadline(self) -> float:
        return self.kill_at if self.kill_at is not None else self.deadline

    def tell_to_stop(self) -> None:
        """On the grader's way out: tell the keeper to kill everything (SIGTERM), as a deadline does."""
        if not self.done:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.keeper.pid, signal.SIGTERM)

    def stop_now(self, grace_until: float) -> None:
        """On the grader's way out, once told (:meth:`tell_to_stop`): wait for the keeper until ``grace_until``,
        then kill its session; reap it."""
        if self.done:
            return
        self.keeper.join(max(0.0, grace_until - time.monotonic()))
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(self.keeper.pid, signal.SIGKILL)
        self.keeper.join()
        self.conn.close()
        self.done = True

    def output_tail(self) -> str:
        try:
            with open(self.output, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4 * OUTPUT_CHARS))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.output)
        return "\n".join(text.splitlines()[-OUTPUT_LINES:])[-OUTPUT_CHARS:]

    def report(self) -> GradeReport:
        """The verdicts — as soon as the measurements are here, while the keeper still cleans up (judging here
        overlaps the processes' exits), or once the keeper has exited without them."""
        if self.judged is None:
            output = self.output_tail()
            self.judged = _judged(self)
            self.judged.seconds = time.monotonic() - self.started
            self.judged.output = output
        return self.judged


def _not_run(job: Job, key: Optional[str], why: str, kind: str) -> GradeReport:
    """Every check failed with ``why`` (the submission never reached its checks)."""
    try:
        spec = get(key) if key else None
    except ValueError:
        spec = None
    if spec is None:
        return GradeReport("??", "unknown exercise", str(job.path), load_error=why)
    checks = core.select(spec, job.checks)
    results = [CheckResult(c.name, c.points, False, f"not run: {why}", kind=kind) for c in checks]
    return GradeReport(spec.key, spec.title, str(job.path), results, load_error=why)


def _ended(code: Optional[int]) -> str:
    if code is None:
        how = "ended"
    elif code < 0:
        how = f"was killed by {signal.Signals(-code).name}" if -code in signal.Signals._value2member_map_ \
            else f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return (f"the submission's process {how} before the grading finished: does the code call os._exit() or end "
            f"its process another way, or use more memory than the machine has?")


def _judged(g: _Grading) -> GradeReport:
    """The verdicts, computed here from the plain data the submission's process sent."""
    job = g.job
    fallback = job.exercise or g.key or loader.exercise_key(job.path, None)
    if g.result is None:
        if g.killed:
            kind = "load-hang" if g.key is None else "hang"
            return _not_run(job, fallback, g.killed, kind)
        if g.too_big:
            return _not_run(job, fallback, f"the measurements came to more than {MAX_RESULT_BYTES >> 20} MiB: does "
                                           f"your code return what the interface says?", "crashed")
        return _not_run(job, fallback, _ended(g.exit_code), "crashed")
    try:
        sent = wire.decode(g.result)
        if not isinstance(sent, dict):
            raise TypeError(f"a {type(sent).__name__}")
    except Exception as e:  # noqa: BLE001 - whatever came back is not a grading: say so
        return _not_run(job, fallback, f"the submission's process sent back something that is not a grading "
                                       f"({type(e).__name__})", "crashed")
    if "crash" in sent:
        last = [line for line in str(sent["crash"]).splitlines() if line.strip()]
        return _not_run(job, fallback, f"the grading stopped in the submission's process: "
                                       f"{last[-1].strip() if last else 'no traceback'}", "crashed")
    key = sent.get("key") if isinstance(sent.get("key"), str) else None
    key = job.exercise or key
    if key is None:
        label = str(job.path)
        return GradeReport("??", "unknown exercise", label,
                           load_error=f"grade: which exercise does {label} answer? Pass exercise='01' (one of "
                                      f"{', '.join(KEYS)}), or name the file after it, e.g. "
                                      f"01_ring_allreduce.ipynb")
    spec = get(key)  # an unknown exercise raises, as it does for a namespace
    checks = core.select(spec, job.checks)
    if sent.get("load_error"):
        kind = "load-hang" if sent.get("load_timed_out") else "load-error"
        why = str(sent["load_error"])
        results = [CheckResult(c.name, c.points, False, f"not run: {why}", kind=kind) for c in checks]
        return GradeReport(spec.key, spec.title, str(job.path), results, load_error=why)
    outcomes = sent.get("outcomes") if isinstance(sent.get("outcomes"), dict) else {}
    measured = {name: wire.scenario_outcome(value) for name, value in outcomes.items()}
    results = core.verdicts(spec, checks, wire.namespace(sent.get("facts")), measured)
    return GradeReport(spec.key, spec.title, str(job.path), results)


def grade_paths(jobs: Sequence[Job], timeout_s: Optional[float] = None, workers: int = 1) -> List[GradeReport]:
    """A :class:`GradeReport` per job, in order, each graded in a process of its own, ``workers`` at a time.

    A job whose exercise cannot be told is a report for exercise "??" whose ``load_error`` says so; an exercise
    that does not exist, or an unknown check, raises ``ValueError`` (after every process has been stopped)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"jobs={workers!r} must be a whole number of submissions graded at once, 1 or more")
    check_timeout(timeout_s)
    _prepare(jobs)
    method = _start_method()
    waiting = list(enumerate(jobs))[::-1]
    running: List[_Grading] = []
    reports: List[Optional[GradeReport]] = [None] * len(jobs)
    with unwinding():  # SIGTERM, SIGHUP: raised here, so that the finally below stops the keepers first
        _grade(waiting, running, reports, timeout_s, workers, method)
    return reports


def _grade(waiting: list, running: List[_Grading], reports: list, timeout_s: Optional[float], workers: int,
           method: str) -> None:
    """:func:`grade_paths`'s loop: start keepers, read what they send, judge, stop what runs past its deadline;
    however it ends (an exception, Ctrl-C, :class:`~zerokit.runtime.termination.Terminated`), every keeper is told to
    stop at once, then each is waited for within the grace and killed past it."""
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                index, job = waiting.pop()
                grading = _Grading(index, job, timeout_s)
                grading.start(method)
                running.append(grading)
            handles = {}
            for grading in running:
                handles.update(grading.handles())
            now = time.monotonic()
            wait_s = max(0.0, min(g.next_deadline() for g in running) - now)
            for ready in mp.connection.wait(list(handles), wait_s):
                handles[ready]()
            now = time.monotonic()
            for grading in list(running):
                if grading.result is not None or grading.done:
                    reports[grading.index] = grading.report()
                if grading.done:
                    running.remove(grading)
                elif now >= grading.next_deadline():
                    grading.expire(now)
    finally:
        for grading in running:
            grading.tell_to_stop()
        grace_until = time.monotonic() + KILL_GRACE_S
        for grading in running:
            grading.stop_now(grace_until)
            with contextlib.suppress(OSError):
                os.unlink(grading.output)
