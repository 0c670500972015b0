"""Every lesson runs top to bottom on this machine and writes nothing to stderr; nbgrader's own scoring of
the executed test cells gives the solution full marks and the untouched student notebook 0.
"""
import json
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbgrader.utils import determine_grade, is_grade

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted(p for p in (REPO / "solutions").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
pytestmark = pytest.mark.slow


def execute(nb, cwd: Path, allow_errors=False):
    NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=allow_errors,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def stderr_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == "stderr")


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_solution_runs_clean_and_scores_full(path):
    nb = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    execute(nb, path.parent)
    print(f"{path.name}: executed in {time.perf_counter() - started:.1f} s")
    for i, cell in enumerate(nb.cells):
        assert not stderr_of(cell), f"{path.name} cell {i} wrote to stderr:\n{stderr_of(cell)[:800]}"
        if is_grade(cell) and cell.cell_type == "code":
            score, max_score = determine_grade(cell)
            assert score == max_score, f"{path.name}: {cell.metadata.nbgrader.grade_id} scored {score}/{max_score}"


STUDENT = [p for p in (REPO / "notebooks").rglob("*.ipynb")
           if ".ipynb_checkpoints" not in p.parts and any(
               is_grade(c) for c in nbformat.read(p, as_version=4).cells)]


@pytest.mark.parametrize("path", STUDENT, ids=[p.name for p in STUDENT])
def test_blank_student_notebook_scores_zero(path):
    """The setup, exercise and test cells of the released notebook, as a student who did nothing submits them."""
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if "setup" in c.metadata.get("tags", []) or "nbgrader" in c.metadata
                and (c.metadata.nbgrader.get("solution") or is_grade(c)) and c.cell_type == "code"]
    execute(nb, path.parent, allow_errors=True)
    graded = [c for c in nb.cells if is_grade(c)]
    assert graded
    for cell in graded:
        assert determine_grade(cell)[0] == 0, f"{path.name}: {cell.metadata.nbgrader.grade_id} gave marks for nothing"
        assert not stderr_of(cell), f"{path.name}: the test cell wrote to stderr"
        assert "NotImplementedError" in json.dumps(cell.outputs), "the report should say the exercise is not done"
