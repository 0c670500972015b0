"""What every executed lesson must show, whoever executed it (nbclient in test_notebooks.py, nbgrader autograde in
test_nbgrader.py and test_nbgrader_lessons.py): no cell raised or wrote to stderr; the reference scores full marks
and the notebook as released 0, each test cell saying that its exercise is not done yet."""
import json
from pathlib import Path

import nbformat
from nbgrader.utils import determine_grade, is_grade


def read(path: Path):
    return nbformat.read(path, as_version=4)


def stderr_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == "stderr")


def assert_ran_clean(nb, label: str) -> None:
    for i, cell in enumerate(nb.cells):
        assert not stderr_of(cell), f"{label} cell {i} wrote to stderr:\n{stderr_of(cell)[:800]}"
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{label} cell {i} raised {errors[0].get('ename')}: {errors[0].get('evalue', '')[:400]}"


def graded_cells(nb) -> list:
    return [c for c in nb.cells if is_grade(c) and c.cell_type == "code"]


def assert_full_marks(nb, label: str) -> None:
    assert_ran_clean(nb, label)
    for cell in graded_cells(nb):
        score, max_score = determine_grade(cell)
        assert score == max_score, f"{label}: {cell.metadata.nbgrader.grade_id} scored {score}/{max_score}"


def assert_blank_scores_zero(nb, label: str) -> None:
    """Run All with every exercise and every prediction left blank: the cells that need an exercise say so."""
    assert_ran_clean(nb, label)
    for cell in graded_cells(nb):
        assert determine_grade(cell)[0] == 0, f"{label}: {cell.metadata.nbgrader.grade_id} gave marks for nothing"
        assert "NotImplementedError" in json.dumps(cell.outputs), f"{label}: the report should say the exercise is not done"
