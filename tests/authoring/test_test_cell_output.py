"""What a test cell shows and what nbgrader reads from it (issue 27), on a two-cell notebook of one cheap exercise.

* Run as a student runs it: the report on stdout, nothing on stderr; no ``Out[]`` at full marks, and short of them
  an ``Out[]`` that says it is the score ("Score: 7 / 10") while nbgrader still reads the number from it.
* nbgrader's Validate: a cell short of full marks fails with the check's own report, never with nbgrader's fixed
  "Partial credit; passed some but not all of the tests" (which a blank notebook used to get).
"""
import os

import nbformat
import pytest
from nbclient import NotebookClient
from nbgrader.utils import determine_grade
from nbgrader.validator import Validator
from variants import zero_memory_per_rank as variants

from autograder.authoring.course import load_course

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EX, POINTS = "zero_memory_per_rank", 10
BLANK = f"def {EX}(num_params, world_size, stage, bytes_per_param=(2, 2, 12)):\n    raise NotImplementedError()\n"
ANSWERS = {"blank": BLANK, "partial": variants.WRONG["stage2_shards_weights_not_gradients"][0],
           "full": load_course().spec_for_exercise(EX).reference_code[EX]}
MEANT = {"blank": 0.0, "partial": 7.0, "full": 10.0}


def notebook(answer: str):
    grader = {"grade": True, "grade_id": f"test_{EX}", "locked": True, "points": POINTS, "schema_version": 3,
              "solution": False, "task": False}
    test = nbformat.v4.new_code_cell(f'from autograder import check\n\ncheck("{EX}", {EX})', metadata={"nbgrader": grader})
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(answer), test])


@pytest.fixture(autouse=True)
def kernel_imports_this_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))


@pytest.fixture(scope="module")
def executed():
    """The three notebooks run as Run All runs them (one kernel each)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYTHONPATH", os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
        env.delenv("NBGRADER_EXECUTION", raising=False)
        out = {}
        for name, answer in ANSWERS.items():
            nb = notebook(answer)
            NotebookClient(nb, timeout=120, kernel_name="python3").execute()
            out[name] = nb.cells[1]
        return out


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_nbgrader_reads_the_score_and_nothing_goes_to_stderr(executed, case):
    cell = executed[case]
    assert not [o for o in cell.outputs if o.output_type == "error" or o.get("name") == "stderr"], cell.outputs
    assert determine_grade(cell) == (MEANT[case], POINTS)
    assert f"{EX}: {MEANT[case]:g} / {POINTS} points" in cell.outputs[0].text


def test_full_marks_show_no_out(executed):
    assert [o.output_type for o in executed["full"].outputs] == ["stream"], executed["full"].outputs


@pytest.mark.parametrize("case", ["blank", "partial"])
def test_short_of_full_marks_the_out_says_it_is_the_score(executed, case):
    (result,) = [o for o in executed[case].outputs if o.output_type == "execute_result"]
    assert float(result.data["text/plain"]) == MEANT[case]
    assert f"Score: {MEANT[case]:g} / {POINTS}" in result.data["text/html"], result.data


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_validate_says_what_failed(case, tmp_path):
    path = tmp_path / "lesson.ipynb"
    nbformat.write(notebook(ANSWERS[case]), path)
    result = Validator().validate(str(path))
    if case == "full":
        assert not result.get("failed"), result
        return
    (failed,) = result["failed"]
    assert "Partial credit" not in failed["error"], failed["error"]
    assert f"{EX}: {MEANT[case]:g} / {POINTS} points" in failed["error"], failed["error"]
    if case == "blank":
        assert "NotImplementedError" in failed["error"], failed["error"]
