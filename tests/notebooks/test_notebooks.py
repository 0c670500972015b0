"""The lessons without exercises run top to bottom on this machine, as the instructor has them and as a student gets
them (Run All), and write nothing to stderr. The graded lessons are executed by nbgrader autograde instead, with the
same checks (lesson_runs.py), in test_nbgrader.py (Lesson 1) and test_nbgrader_lessons.py (the others): each lesson
then runs twice per test run, not four times.

A lesson without exercises is run once where the student's copy and the solution notebook hold the same code cells
and their folders the same files (the generator strips nothing from such a lesson): that one run is the instructor's
and the student's. Where they differ, both run.
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


def what_runs(path: Path) -> tuple:
    """What executing the notebook depends on: its code cells and the other files beside it (it runs in its folder)."""
    code = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    beside = {f.name: f.read_bytes() for f in path.parent.iterdir() if f.is_file() and f.suffix != ".ipynb"}
    return code, beside


def test_every_lesson_is_executed_somewhere():
    """Each notebook is either here or graded by nbgrader's autograde (which executes it whole)."""
    assert {p.name for p in UNGRADED} and GRADED and not {p.name for p in UNGRADED} & GRADED
    assert {p.name for p in (REPO / "solutions").rglob("*.ipynb")} == {p.name for p in UNGRADED} | GRADED


@pytest.mark.parametrize("path", UNGRADED, ids=[p.name for p in UNGRADED])
def test_lesson_runs_clean_for_student_and_instructor(path):
    """Run All of the student's copy; the solution notebook runs as well only where it would run something else."""
    released, solution = REPO / "notebooks" / path, REPO / "solutions" / path
    assert_blank_scores_zero(execute(released), path.name)
    if what_runs(solution) != what_runs(released):
        assert_full_marks(execute(solution), path.name)
