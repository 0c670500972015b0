"""Real `nbgrader autograde` on every graded lesson after Lesson 1 (whose full exchange round trip is in
test_nbgrader.py): the released notebook with the reference answer scores full, the untouched one 0, and
nbgrader executes the *whole* lesson for both, so a lesson that breaks under nbgrader's kernel fails here. These
two runs are also the lesson's runs top to bottom (lesson_runs.py): no cell raises or writes to stderr, as the
instructor has it (the released notebook with the reference answers is the solution notebook) and as a student gets
it (Run All with nothing filled in).

Submissions are placed in nbgrader's submitted/ folder directly, their students unknown to the gradebook until
autograde adds them (the exchange steps and the roster's `db student import` are Lesson 1's test).
Lesson 3 forks gloo ranks inside nbgrader's kernel: afterwards no process may be left behind.
"""
import json
import os

import pytest
from lesson_runs import assert_blank_scores_zero, assert_full_marks, read
from nbgrader.api import Gradebook
from nbgrader_cli import COURSE, NBGRADER, run
from processes import descendants_left
from submission_factory import filled, reference_source, released_notebook, write

from autograder.authoring.course import cell_source, load_course

COURSE_ID = "training-at-scale"  # classroom/nbgrader_config.py

pytestmark = pytest.mark.slow


def graded_lessons() -> list:
    """(assignment, notebook, {exercise: points}) for each graded notebook but Lesson 1's."""
    return [(s.assignment, s.name, s.test_points) for s in load_course().notebooks.values()
            if s.exercises and s.assignment != "lesson1"]


def nbgrader(*args, env):
    run([NBGRADER, *args], COURSE, env, timeout=1200)


def test_every_graded_lesson_is_here():
    assert {a for a, _, _ in graded_lessons()} >= {"lesson2", "lesson3", "lesson4", "lesson5"}


@pytest.mark.parametrize("assignment,name,points", graded_lessons(), ids=[a for a, _, _ in graded_lessons()])
def test_autograde_full_for_reference_zero_for_blank(assignment, name, points, tmp_path, subreaper):
    """One lesson per test: each gets its own time limit, and a failure names its lesson."""
    env = {**os.environ, "NBGRADER_COURSE_ROOT": str(tmp_path), "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data")}
    release = f"--CourseDirectory.release_directory={tmp_path / 'release'}"
    # No `db student add`: autograde adds the students it grades (nbgrader's Autograde.create_student, on by
    # default since 0.7); two nbgrader starts less per lesson (~3 CPU-s each).
    nbgrader("generate_assignment", assignment, "--force", release, env=env)
    ada = filled(name, {ex: reference_source(ex) for ex in points})
    write(tmp_path / "submitted" / "ada", assignment, name, ada)
    write(tmp_path / "submitted" / "bob", assignment, name, released_notebook(name))
    nbgrader("autograde", assignment, "--force", env=env)
    assert descendants_left() == [], f"{assignment}: nbgrader's kernel left processes behind"
    # The scores as `nbgrader export` reads them (export itself is Lesson 1's test): one nbgrader start less.
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}", COURSE_ID) as gradebook:
        got = {s: (gradebook.find_submission(assignment, s).score, gradebook.find_submission(assignment, s).max_score)
               for s in ("ada", "bob")}
    total = sum(points.values())
    assert got["ada"] == (total, total), (assignment, got["ada"])
    assert got["bob"] == (0.0, total), (assignment, got["bob"])
    assert_full_marks(read(tmp_path / "autograded" / "ada" / assignment / name), f"{name} (the reference, autograded)")
    assert_blank_scores_zero(read(tmp_path / "autograded" / "bob" / assignment / name), f"{name} (as released, autograded)")


def test_the_reference_submission_is_the_solution_notebook():
    """So that its autograde above is the solution notebook's run: the two differ in no cell."""
    for _, name, points in graded_lessons():
        spec = load_course().notebooks[name]
        solution = json.loads(spec.source.read_text())["cells"]
        reference = filled(name, {ex: reference_source(ex) for ex in points})["cells"]
        assert [cell_source(c) for c in reference] == [cell_source(c) for c in solution], name
