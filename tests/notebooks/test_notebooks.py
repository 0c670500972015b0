"""The lessons without exercises run top to bottom on this machine, as the instructor has them and as a student gets
them (Run All), and write nothing to stderr. The graded lessons are executed by nbgrader autograde instead, with the
same checks (lesson_runs.py), in test_nbgrader.py (Lesson 1) and test_nbgrader_lessons.py (the others): each lesson
then runs twice per test run, not four times.
"""
import time
from pathlib import Path

import nbformat
import pytest
from lesson_runs import assert_blank_scores_zero, assert_full_marks
from nbclient import NotebookClient

from autograder.authoring.course import load_course

REPO = Path(__file__).resolve().parents[2]
GRADED = {name for name, spec in load_course().notebooks.items() if spec.exercises}
UNGRADED = sorted(p.relative_to(REPO / "solutions") for p in (REPO / "solutions").rglob("*.ipynb")
                  if ".ipynb_checkpoints" not in p.parts and p.name not in GRADED)
pytestmark = pytest.mark.slow


def execute(path: Path):
    nb = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    print(f"{path}: executed in {time.perf_counter() - started:.1f} s")
    return nb


def test_every_lesson_is_executed_somewhere():
    """Each notebook is either here or graded by nbgrader's autograde (which executes it whole)."""
    assert {p.name for p in UNGRADED} and GRADED and not {p.name for p in UNGRADED} & GRADED
    assert {p.name for p in (REPO / "solutions").rglob("*.ipynb")} == {p.name for p in UNGRADED} | GRADED


@pytest.mark.parametrize("path", UNGRADED, ids=[p.name for p in UNGRADED])
def test_solution_runs_clean(path):
    assert_full_marks(execute(REPO / "solutions" / path), path.name)


@pytest.mark.parametrize("path", UNGRADED, ids=[p.name for p in UNGRADED])
def test_student_notebook_runs_all_clean(path):
    assert_blank_scores_zero(execute(REPO / "notebooks" / path), path.name)
