"""Put class-grading results where nbgrader's tools look: the gradebook and the autograded notebooks.

After ``python -m autograder grade ... --gradebook``, formgrader shows each submission with its score,
the autograded notebook shows the checks' report in its test cell, and ``nbgrader export`` /
``nbgrader generate_feedback`` work as if ``nbgrader autograde`` had run.
"""
import json
import tempfile
from collections import defaultdict
from pathlib import Path

from .course import Course
from .generate import COURSE_DIR
from .grading import Row
from .notebook import NotebookProblem, parse_notebook
from .submissions import Submission, match_notebooks
from .verdict import format_report


def _course_directory():
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(COURSE_DIR)).load_config()
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
    """Fill a test cell's outputs as nbgrader would have: the report on stdout, the score as the result."""
    from .exercise import CheckResult

    checks = [CheckResult(**c) for c in row.checks]
    report = format_report(row.exercise, checks) if checks else f"{row.exercise}: not graded. {row.feedback}"
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": report + "\n"},
                       {"output_type": "execute_result", "execution_count": None, "metadata": {},
                        "data": {"text/plain": f"{row.score:g}"}}]


def record_in_gradebook(rows: list[Row], submissions: list[Submission], course: Course) -> str:
    from nbgrader.api import Gradebook

    coursedir, config = _course_directory()
    by_student = {s.student: s for s in submissions}
    grouped = defaultdict(list)  # (student, notebook) -> rows
    for row in rows:
        grouped[(row.student, row.notebook)].append(row)
    with Gradebook(coursedir.db_url, coursedir.course_id) as gradebook:
        for student, notebook in sorted(grouped):
            spec = course.notebooks[notebook]
            _ensure_assignment(gradebook, spec.assignment, config)
            gradebook.update_or_create_student(student)
            gradebook.update_or_create_submission(spec.assignment, student)
            notebook_id = notebook[: -len(".ipynb")]
            for row in grouped[(student, notebook)]:
                grade = gradebook.find_grade(f"test_{row.exercise}", notebook_id, spec.assignment, student)
                grade.auto_score = row.score
            gradebook.db.commit()
            _write_autograded(coursedir, by_student[student], course, notebook, grouped[(student, notebook)])
    return f"recorded {len(rows)} scores in {coursedir.db_url}"


def _write_autograded(coursedir, submission: Submission, course: Course, notebook: str, rows: list[Row]) -> None:
    spec = course.notebooks[notebook]
    path, _ = match_notebooks(submission, course, [notebook])[notebook]
    try:
        nb = parse_notebook(submission.files[path]) if path else None
    except NotebookProblem:
        nb = None
    if nb is None:  # nothing readable was submitted: show the released notebook, with the reasons
        nb = json.loads((course.root / "notebooks" / spec.assignment / notebook).read_text())
    by_test = {f"test_{r.exercise}": r for r in rows}
    for cell in nb["cells"]:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in by_test:
            _report_cell(cell, by_test[grade_id])
    target = Path(coursedir.format_path(coursedir.autograded_directory, submission.student, spec.assignment)) / notebook
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(nb, indent=1))
