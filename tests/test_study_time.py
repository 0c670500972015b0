"""Study times are computed from the material (coursekit.study_time), and every place that states one is current."""
import json
import re
from pathlib import Path

import pytest

from coursekit.study_time import STATED, material, start_page_row, study_minutes

REPO = Path(__file__).resolve().parent.parent
LESSONS = sorted((REPO / "solutions").glob("lesson*/*.ipynb"))
START = "".join(line for c in json.loads((REPO / "solutions/00-start-here.ipynb").read_text())["cells"]
                if c["cell_type"] == "markdown" for line in c["source"])


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_the_stated_study_time_is_the_computed_one(path):
    minutes = study_minutes(path)
    title = "".join(json.loads(path.read_text())["cells"][0]["source"])
    assert [int(m) for m in STATED.findall(title)] == [minutes], \
        f"{path.stem}: the title must say 'study time about {minutes} minutes' (python -m coursekit.study_time --write)"
    row = start_page_row(path).search(START)
    assert row and int(row.group(2)) == minutes, f"{path.stem}: the start page's table must say about {minutes} min"


def test_the_formula_counts_what_a_student_reads_and_does(tmp_path):
    cells = [{"cell_type": "markdown", "source": ["# Title\n", "*study time about 99 minutes*\n", "one two three"]},
             {"cell_type": "code", "metadata": {}, "source": ["x = 1\n", "\n", "my_guess = None  # e.g. 2\n"]},
             {"cell_type": "code", "metadata": {"nbgrader": {"solution": True}},
              "source": ["def f():\n", "    ### BEGIN SOLUTION\n", "    return 1\n", "    ### END SOLUTION\n"]},
             {"cell_type": "code", "metadata": {"nbgrader": {"grade": True}}, "source": ["check('f', f)"]}]
    notebook = tmp_path / "lesson9" / "09_x.ipynb"
    notebook.parent.mkdir()
    notebook.write_text(json.dumps({"cells": cells}))
    assert material(notebook) == {"words": 6, "code lines": 3, "predictions": 1, "exercises": 1}
    assert study_minutes(notebook) == 30  # 6/150 + 3/15 + 3 + 25 = 28.24, rounded up to 5


def test_the_start_page_says_where_study_times_come_from():
    assert "coursekit.study_time" in START and re.search(r"words.*code.*predictions.*exercises", START, re.S)
