"""Grade one student: read their notebooks, run their exercise cells in a worker, judge the observations.

``grade_submission`` is a plain function of plain inputs, so it runs the same in a thread here or on a
Dask worker elsewhere. The verdict happens here, in the grader's process, on data only.
"""
import hashlib
import re
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

from ..authoring.course import Course
from ..exercises import get_exercise
from ..exercises.diagnosis import diagnose
from ..exercises.verdict import feedback_sentence, total
from .audit import audit
from .escape import strip_controls
from .notebook import NotebookProblem, exercise_cells
from .protocol import REASON_CHARS, TaskResult, clean_text
from .runner import Task, run_tasks
from .sandbox.sandbox import Sandbox
from .submissions import Submission, match_notebooks

ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


@dataclass
class Row:
    student: str
    notebook: str
    exercise: str
    score: float
    max_score: float
    feedback: str
    checks: list[dict] = field(default_factory=list)   # per check: title, points, score, feedback
    output: str = ""                                   # what the student's code printed (feedback files)
    graded: bool = True                                # False: the code could not be run (reason in feedback)
    name: str = ""                                     # the student's readable name (from the LMS file names)
    review: list[str] = field(default_factory=list)    # what in the cell an instructor may want to read (audit.py)
    cause: str = ""                                    # the diagnosed mistake's catalogue id(s) (diagnosis.py)
    diagnosis: dict = field(default_factory=dict)      # the whole diagnosis, for the feedback files and notebooks

    CSV_FIELDS = ("student", "notebook", "exercise", "score", "max_score", "feedback", "name", "cause")


@dataclass
class SubmittedNotebook:
    """One wanted notebook of a submission, read once a run: grading and the class report's similarity both use it."""
    path: str | None                           # where it is in the submission; None: not found
    note: str                                  # for the student (a notebook graded under another file name, ...)
    cells: dict[str, str | NotebookProblem]    # per exercise: the student's cell, or why it cannot be graded


def read_notebooks(submission: Submission, course: Course, wanted: list[str]) -> dict[str, SubmittedNotebook]:
    """Each wanted notebook's exercise cells (``notebook.exercise_cells``); a notebook that cannot be read or is
    missing gives every exercise of it that problem."""
    found = {}
    for name, (path, note) in match_notebooks(submission, course, wanted).items():
        spec = course.notebooks[name]
        try:
            if path is None:
                raise NotebookProblem(note)
            cells = exercise_cells(submission.notebook(path), spec)
        except NotebookProblem as problem:
            cells = {exercise: problem for exercise in spec.exercises}
        found[name] = SubmittedNotebook(path, note, cells)
    return found


def _clean(text: str) -> str:
    """Same input, same file: drop memory addresses that differ from run to run."""
    return ADDRESS.sub("0x…", text)


def grade_submission(submission: Submission, course: Course, wanted: list[str], references: dict[str, dict],
                     sandbox: Sandbox, timeout: float | None = None,
                     notebooks: dict[str, SubmittedNotebook] | None = None) -> tuple[list[Row], dict]:
    """All rows of one student (one per exercise of every wanted notebook) and phase timings. ``notebooks``: what
    ``read_notebooks`` found in the submission, when the caller has read it already.

    Never raises: whatever goes wrong for this student becomes this student's rows, so the batch goes on."""
    try:
        return _grade_submission(submission, course, wanted, references, sandbox, timeout, notebooks)
    except Exception as exc:  # a grader bug this submission triggers: it must cost only this student's grade
        reason = (f"The grader failed on this submission ({type(exc).__name__}); your instructor has the details "
                  "and will grade it by hand.")
        print(strip_controls(f"autograder: internal error while grading {submission.student!r}:\n"
                             f"{traceback.format_exc()}"), file=sys.stderr)
        rows = [_ungraded(submission, n, e, reason) for n in wanted for e in course.notebooks[n].exercises]
        return rows, {"parse_s": 0.0, "run_s": 0.0, "verdict_s": 0.0, "worker_peak_mib": 0.0}


def _grade_submission(submission, course, wanted, references, sandbox, timeout, notebooks):
    started = time.perf_counter()
    rows: dict[tuple[str, str], Row] = {}
    tasks: list[Task] = []
    notes: dict[str, str] = {}
    reviews: dict[tuple[str, str], list[str]] = {}
    if notebooks is None:
        notebooks = read_notebooks(submission, course, wanted)
    for name, found in notebooks.items():
        spec = course.notebooks[name]
        notes[name] = found.note
        for exercise, code in found.cells.items():
            if isinstance(code, NotebookProblem):
                rows[(name, exercise)] = _ungraded(submission, name, exercise,
                                                   (found.note if found.path else "") + str(code))
                continue
            reviews[(name, exercise)] = [str(f) for f in audit(code)]
            setup = [(f"setup cell of {name}", c) for c in spec.setup_code]
            tasks.append(Task(f"{name}::{exercise}", exercise, tuple(setup + [(f"your cell `{exercise}`", code)]),
                              timeout or get_exercise(exercise).timeout_s,
                              references[exercise]["salt"]))  # the scenarios the reference was observed on
    parsed = time.perf_counter()
    results, peak_mib = run_isolated(tasks, sandbox)
    ran = time.perf_counter()
    for task in tasks:
        name, exercise = task.key.split("::")
        rows[(name, exercise)] = _judge(submission, name, exercise, results[task.key], references[exercise],
                                        notes[name])
        rows[(name, exercise)].review = reviews[(name, exercise)]
    order = {(n, e): i for i, (n, e) in enumerate((n, e) for n in wanted for e in course.notebooks[n].exercises)}
    timings = {"parse_s": parsed - started, "run_s": ran - parsed, "verdict_s": time.perf_counter() - ran,
               "worker_peak_mib": peak_mib}
    return [rows[key] for key in sorted(rows, key=order.get)], timings


class AloneOrShared:
    """Workers that start ranks run alone; the others run side by side. A per-user quota (epoll watches, ...) that
    one student's code fills makes gloo fail in every rank of the same uid, so under one identity no other
    student's worker may be alive while ranks run. Waiting "alone" workers go first."""

    def __init__(self):
        self._changed = threading.Condition()
        self._shared = self._waiting = 0
        self._alone = False

    @contextmanager
    def shared(self):
        with self._changed:
            self._changed.wait_for(lambda: not self._alone and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            with self._changed:
                self._shared -= 1
                self._changed.notify_all()

    @contextmanager
    def alone(self):
        with self._changed:
            self._waiting += 1
            self._changed.wait_for(lambda: not self._alone and not self._shared)
            self._waiting -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()


RANK_EXERCISES_ALONE = AloneOrShared()


def by_worker(tasks: list[Task], sandbox: Sandbox):
    """``(tasks, sandbox)`` per kind of worker the tasks need: an exercise that needs a library the others forbid
    (``Exercise.needs_libraries``) or whose ranks share files (``Exercise.ranks_share_files``) gets a worker of its
    own, made so; every other one the sandbox as it is."""
    def needs(task: Task) -> tuple[tuple[str, ...], bool]:
        exercise = get_exercise(task.exercise)
        return exercise.needs_libraries, exercise.ranks_share_files

    for libraries, share_files in sorted({needs(t) for t in tasks}):
        made = sandbox.allowing(libraries)
        yield ([t for t in tasks if needs(t) == (libraries, share_files)],
               replace(made, isolate_ranks=False) if share_files else made)


def run_isolated(tasks: list[Task], sandbox: Sandbox) -> tuple[dict, float]:
    """One student's tasks in one worker per kind they need (``by_worker``)."""
    results, peak_mib = {}, 0.0
    for group, made in by_worker(tasks, sandbox):
        more, peak = _run_in_one_worker(group, made)
        results, peak_mib = {**results, **more}, max(peak_mib, peak)
    return results, peak_mib


def _run_in_one_worker(tasks: list[Task], sandbox: Sandbox) -> tuple[dict, float]:
    """Where every worker shares the grader's identity, the rank exercises in a worker of their own that runs while
    no other worker does (``Sandbox.one_identity``). The next one starts a fresh sandbox (seconds to import torch),
    while a killed one's processes, and the watches they held, are gone within milliseconds, so no canary run is
    needed before blaming a student's code for a gloo failure."""
    if not sandbox.one_identity:
        return run_tasks(tasks, sandbox)
    ranked = [t for t in tasks if get_exercise(t.exercise).ranks]
    results, peak_mib = {}, 0.0
    if len(ranked) < len(tasks):
        with RANK_EXERCISES_ALONE.shared():
            results, peak_mib = run_tasks([t for t in tasks if t not in ranked], sandbox)
    if ranked:
        with RANK_EXERCISES_ALONE.alone():
            more, peak = run_tasks(ranked, sandbox)
        results, peak_mib = {**results, **more}, max(peak_mib, peak)
    return results, peak_mib


def _ungraded(submission: Submission, notebook: str, exercise: str, reason: str) -> Row:
    return Row(submission.student, notebook, exercise, 0.0, get_exercise(exercise).max_score,
               _clean(clean_text(reason, 2 * REASON_CHARS)), graded=False, name=submission.name)


def _judge(submission: Submission, notebook: str, exercise: str, result: TaskResult, reference: dict, note: str) -> Row:
    ex = get_exercise(exercise)
    if result.status != "ok":
        row = _ungraded(submission, notebook, exercise, note + result.reason)
        row.output = _clean(result.output)
        return row
    checks = ex.grade(result.observation, reference)
    diagnosis = diagnose(ex, result.observation, reference, checks)
    return Row(submission.student, notebook, exercise, float(total(checks)), ex.max_score,
               _clean(strip_controls(note + feedback_sentence(checks, diagnosis))), [asdict(c) for c in checks],
               _clean(result.output), name=submission.name, cause=diagnosis.cause_id, diagnosis=diagnosis.to_dict())


def held_out_salt(course: Course, exercise: str) -> int:
    """The salt of the held-out scenarios an exercise is graded on: derived from its solution and setup cells,
    which never leave the instructor's repository, so it is the same run after run and changes with the
    solution. (Knowing it would not help a student: a scenario's answer still takes the real computation.)"""
    from ..selfcheck.recorded import canonical

    spec = course.spec_for_exercise(exercise)
    digest = hashlib.sha256(b"held-out scenarios\0" + canonical(spec.setup_code + [spec.reference_code[exercise]]))
    return int.from_bytes(digest.digest()[:4], "big") % (2**31 - 1) + 1


def reference_observations(course: Course, exercises: list[str], sandbox: Sandbox,
                           salt: int | None = None) -> dict[str, dict]:
    """Observe every reference solution once, in the same kind of worker as the students' code: on each
    exercise's held-out scenarios (``salt=None``, class grading) or on those of the given salt (0: public)."""
    tasks = [Task(e, e, tuple(course.reference_cells(e)), max(get_exercise(e).timeout_s, 120),
                  held_out_salt(course, e) if salt is None else salt) for e in exercises]
    results = {}
    for group, made in by_worker(tasks, sandbox):  # as the students' are; a reference's worker keeps every library
        results.update(run_tasks(group, made, as_reference=True)[0])
    broken = {k: r.reason for k, r in results.items() if r.status != "ok"}
    if broken:
        raise RuntimeError(f"the reference solutions could not be observed: {broken}")
    return {k: r.observation for k, r in results.items()}
