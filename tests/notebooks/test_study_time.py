"""Study times are computed from the material (coursekit.study_time), and every place that states one is current."""
import json
import re
from pathlib import Path

import pytest

from coursekit.study_time import DIFFICULTY, STATED, exercise_minutes, material, say, start_page_row, statement, study_minutes

REPO = Path(__file__).resolve().parents[2]
LESSONS = sorted((REPO / "solutions").glob("lesson*/*.ipynb"))
START = "".join(line for c in json.loads((REPO / "solutions/00-start-here.ipynb").read_text())["cells"]
                if c["cell_type"] == "markdown" for line in c["source"])


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_the_stated_study_time_is_the_computed_one(path):
    title = "".join(json.loads(path.read_text())["cells"][0]["source"])
    assert [m.group(0) for m in STATED.finditer(title)] == [statement(path)], \
        f"{path.stem}: the title must say '{statement(path)}' (python -m coursekit.study_time --write)"
    row = start_page_row(path).search(START)
    minutes = say(study_minutes(path))
    assert row and row.group(2) == minutes, f"{path.stem}: the start page's table must say {minutes}"


def test_the_formula_counts_what_a_student_reads_and_does(tmp_path):
    cells = [{"cell_type": "markdown", "source": ["# Title\n", "*study time about 99 min (graded: `f` about 9 h)*\n",
                                                  "one two three"]},
             {"cell_type": "code", "metadata": {}, "source": ["x = 1\n", "\n", "my_guess = None  # e.g. 2\n"]},
             {"cell_type": "code", "metadata": {"nbgrader": {"solution": True, "grade_id": "average_gradients"}},
              "source": ["def f():\n", "    ### BEGIN SOLUTION\n", "    # a comment\n", "    return 1\n",
                         "    ### END SOLUTION\n"]},
             {"cell_type": "code", "metadata": {"nbgrader": {"grade": True}}, "source": ["check('f', f)"]}]
    notebook = tmp_path / "lesson9" / "09_x.ipynb"
    notebook.parent.mkdir()
    notebook.write_text(json.dumps({"cells": cells}))
    assert material(notebook) == {"words": 6, "code lines": 3, "predictions": 1,
                                  "exercises": {"average_gradients": 1}}
    assert exercise_minutes("average_gradients", 1) == 15  # (10 + 2 × 1) × 1, rounded up to 5
    assert study_minutes(notebook) == 20  # 6/150 + 3/15 + 3 + 15 = 18.24, rounded up to 5
    assert statement(notebook) == "study time about 20 min (graded: `average_gradients` about 15 min)"


def test_the_hardest_exercises_are_planned_in_hours():
    lines = {name: lines for path in LESSONS for name, lines in material(path)["exercises"].items()}
    assert set(lines) == set(DIFFICULTY), "every graded exercise declares a difficulty, with its reason"
    for name in ("FlashAttention", "ring_attention", "ExpertParallelMoE"):
        assert exercise_minutes(name, lines[name]) >= 180, name
    assert say(45) == "about 45 min" and say(125) == "about 2 h" and say(335) == "about 5.5 h"


def test_the_start_page_says_where_study_times_come_from():
    assert "coursekit.study_time" in START and re.search(r"words.*code.*predictions.*exercise", START, re.S)
