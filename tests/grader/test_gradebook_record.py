"""`--gradebook` as formgrader reads it (issue 27): autograded cells need no manual grade, recording warns nothing,
and it works from a shell that never activated the venv (`.venv/bin/python -m autograder grade --gradebook`).

The grading itself is not run here: rows as the grader returns them are recorded into a fresh gradebook in a
temporary course root (NBGRADER_COURSE_ROOT), the way `python -m autograder grade --gradebook` records them.
"""
import warnings

import pytest
from submission_factory import filled, reference_source, released_notebook, write

from autograder.authoring.course import load_course
from autograder.grader.gradebook import record_in_gradebook
from autograder.grader.rows import Row
from autograder.grader.submissions import discover

NB, EX, ASSIGNMENT = "01_gradient_accumulation.ipynb", "train_with_accumulation", "lesson1"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("gradebook")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NBGRADER_COURSE_ROOT", str(tmp_path / "instructor"))
        env.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")  # a fresh shell: nbgrader's `alembic` is not on PATH
        yield _record(tmp_path)


def _record(tmp_path):
    (tmp_path / "instructor").mkdir()
    write(tmp_path / "submissions", "alice", NB, filled(NB, {EX: reference_source(EX)}))
    write(tmp_path / "submissions", "bob", NB, released_notebook(NB))
    write(tmp_path / "submissions", "carol", NB, with_extra_graded_cells(filled(NB, {EX: reference_source(EX)})))
    course = load_course()
    rows = [Row("alice", NB, EX, 11.0, 11.0, "all checks pass"), Row("bob", NB, EX, 0.0, 11.0, "NotImplementedError"),
            Row("carol", NB, EX, 11.0, 11.0, "all checks pass")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, problems = record_in_gradebook(rows, discover(tmp_path / "submissions", course), course)
    assert not problems, problems
    return tmp_path, caught


def with_extra_graded_cells(nb: dict) -> dict:
    """Issue 37: cells a student added with nbgrader metadata of their own (a graded cell worth 5 points, a Markdown
    solution cell), whose grade_ids the release does not have."""
    extra = [{"cell_type": "code", "execution_count": None, "outputs": [], "source": "5",
              "metadata": {"nbgrader": {"grade": True, "grade_id": "extra_credit", "locked": False, "points": 5,
                                        "schema_version": 3, "solution": False, "task": False}}},
             {"cell_type": "markdown", "source": "My answer",
              "metadata": {"nbgrader": {"grade": False, "grade_id": "my_answer", "locked": False,
                                        "schema_version": 3, "solution": True, "task": False}}}]
    return {**nb, "cells": nb["cells"] + extra}


def _gradebook(root):
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{root / 'gradebook.db'}", "training-at-scale")


def test_autograded_submissions_need_no_manual_grade(recorded):
    """Formgrader's "Needs Manual Grade" column is the gradebook's needs_manual_grade: False, as after autograde."""
    root = recorded[0] / "instructor"
    with _gradebook(root) as gb:
        rows = {s["student"]: s for s in gb.submission_dicts(ASSIGNMENT)}
        assert rows["alice"]["score"] == 11.0 and rows["bob"]["score"] == 0.0
        assert not rows["alice"]["needs_manual_grade"] and not rows["bob"]["needs_manual_grade"], rows
        for nb in gb.notebook_submission_dicts(NB[: -len(".ipynb")], ASSIGNMENT):
            assert not nb["needs_manual_grade"], nb


def test_a_new_gradebook_is_made_from_a_shell_without_the_venv(recorded):
    """The fixture records with a bare PATH: nbgrader found its `alembic` anyway and made the gradebook."""
    root = recorded[0] / "instructor"
    with _gradebook(root) as gb:
        assert {s.id for s in gb.students} == {"alice", "bob", "carol"}


def test_autograded_test_cells_show_a_result_only_short_of_full_marks(recorded):
    """As the self-check: no Out[] at 11 / 11; a plain-text score (nothing formgrader would render as HTML) below."""
    import json

    root = recorded[0] / "instructor" / "autograded"
    outputs = {}
    for student in ("alice", "bob"):
        nb = json.loads((root / student / ASSIGNMENT / NB).read_text())
        (cell,) = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == f"test_{EX}"]
        outputs[student] = cell["outputs"]
    assert [o["output_type"] for o in outputs["alice"]] == ["stream"], outputs["alice"]
    assert outputs["bob"][1]["output_type"] == "execute_result" and outputs["bob"][1]["data"] == {"text/plain": "0.0"}


def test_only_the_releases_graded_cells_stay_graded_and_nbgraders_feedback_works(recorded):
    """As OverwriteCells does: a cell whose grade_id the release lacks is an ordinary cell in the autograded notebook
    (the gradebook has no entry for it); nbgrader's own generate_feedback then works for that student."""
    import json
    import os

    from nbgrader_cli import COURSE, NBGRADER, run

    root = recorded[0] / "instructor"
    released = {c["metadata"]["nbgrader"]["grade_id"] for c in released_notebook(NB)["cells"]
                if "nbgrader" in c.get("metadata", {})}
    nb = json.loads((root / "autograded" / "carol" / ASSIGNMENT / NB).read_text())
    kept = [c["metadata"]["nbgrader"]["grade_id"] for c in nb["cells"] if "nbgrader" in c["metadata"]]
    assert set(kept) == released and len(kept) == len(released)
    assert any(c["source"] == "My answer" for c in nb["cells"])  # the cell itself stays, as the student wrote it
    env = {**os.environ, "NBGRADER_COURSE_ROOT": str(root)}
    run([NBGRADER, "generate_feedback", ASSIGNMENT, "--student", "carol", "--force"], COURSE, env)
    assert list((root / "feedback" / "carol" / ASSIGNMENT).glob("*.html"))


def test_recording_warns_nothing(recorded):
    """No SQLAlchemy SAWarning ("Object of type <SubmittedAssignment> not in session ...") or any other warning."""
    _, caught = recorded
    assert not caught, [f"{w.category.__name__}: {w.message}" for w in caught]


def test_a_manual_grade_is_flagged_for_review_when_graded_again(recorded):
    """As nbgrader autograde does: a score a grader typed in stays, and formgrader asks them to look again.
    (Last in this file: it changes the shared gradebook.)"""
    tmp_path, _ = recorded
    root = tmp_path / "instructor"
    with _gradebook(root) as gb:
        gb.find_grade(f"test_{EX}", NB[: -len(".ipynb")], ASSIGNMENT, "bob").manual_score = 3.0
        gb.db.commit()
    course = load_course()
    rows = [Row("bob", NB, EX, 0.0, 11.0, "NotImplementedError")]
    record_in_gradebook(rows, discover(tmp_path / "submissions", course), course)
    with _gradebook(root) as gb:
        grade = gb.find_grade(f"test_{EX}", NB[: -len(".ipynb")], ASSIGNMENT, "bob")
        assert grade.manual_score == 3.0 and grade.needs_manual_grade
