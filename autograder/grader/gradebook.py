"""Put class-grading results where nbgrader's tools look: the gradebook and the autograded notebooks.

After ``python -m autograder grade ... --gradebook``, formgrader shows each submission with its score,
the autograded notebook shows the checks' report in its test cell, and ``nbgrader export`` /
``nbgrader generate_feedback`` work as if ``nbgrader autograde`` had run.

The autograded notebook is rebuilt from the typed cells (``notebook.Cell``), never copied from the upload:
every output is cleared as ``nbgrader autograde`` does (only the test cells get our plain-text report),
cell and notebook metadata are the grader's own, and HTML in Markdown or raw cells is escaped, because
formgrader and ``generate_feedback`` render these notebooks as HTML in the instructor's Jupyter origin.
A student id that is not a safe file name becomes ``<prefix>-<hash>`` in the gradebook (as in feedback/).
"""
import json
import os
import re
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from ..authoring.course import Course, nbgrader_config
from ..exercises.exercise import CheckResult
from ..exercises.judging.diagnosis import Diagnosis
from ..exercises.judging.verdict import format_report, score_result
from .escape import file_stem, strip_controls
from .notebook import Cell, Notebook, NotebookProblem, parse_notebook
from .rows import Row
from .submissions import Submission, match_notebooks

SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$")


def _alembic_on_path() -> None:
    """nbgrader creates a gradebook by running ``alembic`` from PATH. A shell that never activated the venv
    (``.venv/bin/python -m autograder grade --gradebook``) has none there; the venv's own is beside this interpreter."""
    beside = Path(sys.executable).parent
    if shutil.which("alembic") is None and (beside / "alembic").is_file():
        os.environ["PATH"] = f"{beside}{os.pathsep}{os.environ.get('PATH', '')}"


def _course_directory():
    from nbgrader.coursedir import CourseDirectory

    _alembic_on_path()
    config = nbgrader_config()
    return CourseDirectory(config=config), config


def _ensure_assignment(gradebook, assignment: str, config) -> None:
    """The gradebook knows an assignment's grade cells once nbgrader has generated it."""
    from nbgrader.api import MissingEntry
    from nbgrader.apps import NbGraderAPI
    from traitlets.config import Config

    try:
        gradebook.find_assignment(assignment)
        return
    except MissingEntry:
        pass
    with tempfile.TemporaryDirectory() as release:
        overrides = Config()
        overrides.CourseDirectory.release_directory = release
        config.merge(overrides)
        result = NbGraderAPI(config=config).generate_assignment(assignment, force=True, create=True)
    if not result["success"]:
        raise RuntimeError(f"nbgrader could not register {assignment}: {result['error']}")


def _report_cell(cell: dict, row: Row) -> None:
    """Fill a test cell's outputs as the self-check does: the report on stdout, then, short of full marks, the
    score as the cell's result (plain text only: formgrader renders these notebooks in the instructor's origin)."""
    checks = [CheckResult(**c) for c in row.checks]
    report = format_report(row.exercise, checks, Diagnosis.from_dict(row.diagnosis)) if checks \
        else f"{row.exercise}: not graded. {row.feedback}"
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": strip_controls(report) + "\n"}]
    result = score_result(row.score, row.max_score)
    if result is not None:
        cell["outputs"].append({"output_type": "execute_result", "execution_count": None, "metadata": {},
                                "data": {"text/plain": result["text/plain"]}})


def gradebook_id(student: str) -> str:
    """The student's id in nbgrader: itself when it is a safe folder name, else ``<prefix>-<hash>``."""
    return student if SAFE_ID.match(student) else file_stem(student)


def record_in_gradebook(rows: list[Row], submissions: list[Submission], course: Course) -> tuple[str, list[str]]:
    """Record every student's scores; returns (summary, problems). One student's failure is that student's
    problem, reported, never the end of the others' recording."""
    from nbgrader.api import Gradebook

    coursedir, config = _course_directory()
    by_student = {s.student: s for s in submissions}
    grouped = defaultdict(list)  # (student, notebook) -> rows
    for row in rows:
        grouped[(row.student, row.notebook)].append(row)
    problems, recorded = [], 0
    with Gradebook(coursedir.db_url, coursedir.course_id) as gradebook:
        for student, notebook in sorted(grouped):
            spec, who = course.notebooks[notebook], gradebook_id(student)
            try:
                _ensure_assignment(gradebook, spec.assignment, config)
                name = by_student[student].name
                lms = {"first_name": name[:128], "lms_user_id": student[:128]} if name and name != student else {}
                gradebook.update_or_create_student(who, **lms)
                stamp, _ = collected_timestamp(coursedir, spec.assignment, who)
                # nbgrader's add_submission reads the assignment's notebooks before it adds the new submission to
                # the session; an autoflush at that read warns (SAWarning "... not in session"). Nothing is pending
                # here, so the flush can wait for its own commit.
                with gradebook.db.no_autoflush:
                    gradebook.update_or_create_submission(spec.assignment, who, **({"timestamp": stamp} if stamp else {}))
                notebook_id = notebook[: -len(".ipynb")]
                for row in grouped[(student, notebook)]:
                    grade = gradebook.find_grade(f"test_{row.exercise}", notebook_id, spec.assignment, who)
                    grade.auto_score = row.score
                    # as nbgrader autograde's SaveAutoGrades: an autograded cell needs no manual grade, unless a
                    # grader already gave one (then formgrader asks them to review it against the new score)
                    grade.needs_manual_grade = grade.manual_score is not None
                gradebook.db.commit()
                _write_autograded(coursedir, by_student[student], who, course, notebook, grouped[(student, notebook)])
                recorded += len(grouped[(student, notebook)])
            except Exception as exc:  # reported per student; the others are still recorded
                gradebook.db.rollback()
                problems.append(f"gradebook entry of {student!r} for {notebook}: {type(exc).__name__}: {exc}")
    return f"recorded {recorded} scores in {coursedir.db_url}", problems


def _escape_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cell_json(cell: Cell) -> dict:
    """A student's cell as nbgrader's autograded notebook holds it: no outputs, only the grader's metadata."""
    source = cell.source if cell.kind == "code" else _escape_html(cell.source)
    out = {"cell_type": cell.kind, "metadata": {}, "source": source}
    if cell.cell_id:
        out["id"] = cell.cell_id
    if cell.grade_id:
        grader = {"grade": cell.grade, "grade_id": cell.grade_id, "locked": cell.locked, "schema_version": 3,
                  "solution": cell.solution, "task": cell.task}
        if cell.grade:
            grader["points"] = cell.points
        if cell.checksum:
            grader["checksum"] = cell.checksum
        out["metadata"]["nbgrader"] = grader
    if cell.kind == "code":
        out.update(execution_count=None, outputs=[])
    return out


def _write_autograded(coursedir, submission: Submission, who: str, course: Course, notebook: str,
                      rows: list[Row]) -> None:
    spec = course.notebooks[notebook]
    released_path = course.root / "notebooks" / spec.assignment / notebook
    released = json.loads(released_path.read_text())  # trusted: the notebook-level metadata comes from here
    path, _ = match_notebooks(submission, course, [notebook])[notebook]
    try:
        typed = submission.notebook(path) if path else None
    except NotebookProblem:
        typed = None
    if typed is None:  # nothing readable was submitted: show the released notebook, with the reasons
        typed = parse_notebook(released_path.read_bytes())
    nb = _notebook_json(typed, released)
    by_test = {f"test_{r.exercise}": r for r in rows}
    for cell in nb["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id in by_test:
            _report_cell(cell, by_test[grade_id])
    target = Path(coursedir.format_path(coursedir.autograded_directory, who, spec.assignment)) / notebook
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(nb, indent=1))
    submitted = Path(coursedir.format_path(coursedir.submitted_directory, who, spec.assignment))
    for name in ("timestamp.txt", "submission_secret.txt"):  # as `nbgrader autograde` does: release_feedback
        kept = submitted / name                                # needs both, the student's fetch_feedback hashes them
        if kept.is_file() and not kept.is_symlink() and kept.stat().st_size < 4096:
            (target.parent / name).write_bytes(kept.read_bytes())


def collected_timestamp(coursedir, assignment: str, who: str):
    """(time, exact text) of nbgrader collect's ``submitted/<student>/<assignment>/timestamp.txt``, or (None, None)
    (an LMS download has none). Formgrader flags late work from it, as after ``nbgrader autograde``."""
    from nbgrader.utils import parse_utc

    path = Path(coursedir.format_path(coursedir.submitted_directory, who, assignment)) / "timestamp.txt"
    try:
        raw = path.read_text()[:100]
        return parse_utc(raw.strip()), raw
    except Exception:  # absent, unreadable or not a time: the submission simply has no time
        return None, None


def _notebook_json(typed: Notebook, released: dict) -> dict:
    nb = {"cells": [cell_json(c) for c in typed.cells], "metadata": released.get("metadata", {}),
          "nbformat": 4, "nbformat_minor": released.get("nbformat_minor", 5)}
    restore_course_cells(nb, released)
    return nb


def restore_course_cells(nb: dict, released: dict) -> None:
    """As ``nbgrader autograde`` does (its OverwriteCells): every graded cell gets the course's nbgrader metadata
    (points, locked), and every locked cell (setup, tests, instructions) the course's type and source, whatever
    the student changed there. Only the exercise cells keep the student's code. A cell whose grade_id the release
    lacks (an "extra_credit" cell worth 5 points, a Markdown solution cell a student added) loses its nbgrader
    metadata, as OverwriteCells drops unknown grade_ids: the gradebook has no entry for it, so nbgrader's
    generate_feedback and formgrader would fail on it."""
    course_cells = {}
    for cell in released.get("cells", []):
        grader = cell.get("metadata", {}).get("nbgrader", {})
        if grader.get("grade_id"):
            course_cells[grader["grade_id"]] = cell
    for cell in nb["cells"]:
        theirs = course_cells.get(cell["metadata"].get("nbgrader", {}).get("grade_id"))
        if theirs is None:
            cell["metadata"].pop("nbgrader", None)
            continue
        cell["metadata"]["nbgrader"] = dict(theirs["metadata"]["nbgrader"])
        if theirs["metadata"]["nbgrader"].get("locked"):
            cell["cell_type"] = theirs["cell_type"]
            cell["source"] = "".join(theirs["source"]) if isinstance(theirs["source"], list) else theirs["source"]
            if cell["cell_type"] == "code":
                cell.setdefault("outputs", []), cell.setdefault("execution_count", None)
            else:
                cell.pop("outputs", None), cell.pop("execution_count", None)
