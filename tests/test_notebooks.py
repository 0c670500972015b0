"""Every lesson runs top to bottom on this machine, as the instructor has it and as a student gets it (Run All with
nothing filled in), and writes nothing to stderr; nbgrader's own scoring of
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


STUDENT = sorted(p for p in (REPO / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


@pytest.mark.parametrize("path", STUDENT, ids=[p.name for p in STUDENT])
def test_blank_student_notebook_runs_all_and_scores_zero(path):
    """Run All on the notebook as released, every exercise and every prediction left blank: no cell fails or writes
    to stderr (the cells that need an exercise say so), and each test cell gives 0 and says the exercise is not done."""
    nb = nbformat.read(path, as_version=4)
    execute(nb, path.parent)
    for i, cell in enumerate(nb.cells):
        assert not stderr_of(cell), f"{path.name} cell {i} wrote to stderr:\n{stderr_of(cell)[:800]}"
    for cell in (c for c in nb.cells if is_grade(c) and c.cell_type == "code"):
        assert determine_grade(cell)[0] == 0, f"{path.name}: {cell.metadata.nbgrader.grade_id} gave marks for nothing"
        assert "NotImplementedError" in json.dumps(cell.outputs), "the report should say the exercise is not done"
