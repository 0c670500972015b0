"""Grade one student: read their notebooks, run their exercise cells in a worker, judge the observations.

``grade_submission`` is a plain function of plain inputs, so it runs the same in a thread here or on a
Dask worker elsewhere. The verdict happens here, in the grader's process, on data only.
"""
import sys
import time
import traceback
from dataclasses import asdict, dataclass

from ..authoring.course import Course
from ..exercises import get_exercise
from ..exercises.judging.diagnosis import diagnose
from ..exercises.judging.verdict import feedback_sentence, total
from .audit import audit
from .escape import strip_controls
from .isolation import run_isolated
from .messages import TaskResult
from .notebook import NotebookProblem, exercise_cells
from .rows import Row, clean, ungraded
from .runner import Task
from .sandbox.launch import Sandbox
from .submissions import Submission, match_notebooks


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
        rows = [ungraded(submission, n, e, reason) for n in wanted for e in course.notebooks[n].exercises]
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
                rows[(name, exercise)] = ungraded(submission, name, exercise,
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


def _judge(submission: Submission, notebook: str, exercise: str, result: TaskResult, reference: dict, note: str) -> Row:
    ex = get_exercise(exercise)
    if result.status != "ok":
        row = ungraded(submission, notebook, exercise, note + result.reason)
        row.output = clean(result.output)
        return row
    checks = ex.grade(result.observation, reference)
    diagnosis = diagnose(ex, result.observation, reference, checks)
    return Row(submission.student, notebook, exercise, float(total(checks)), ex.max_score,
               clean(strip_controls(note + feedback_sentence(checks, diagnosis))), [asdict(c) for c in checks],
               clean(result.output), name=submission.name, cause=diagnosis.cause_id, diagnosis=diagnosis.to_dict())


