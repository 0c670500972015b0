"""Exercises are specified, not dictated: the released cell states the interface and names the steps, and the answer
stays out of it; the help a student may take lives in collapsed hints right below the exercise cell.

* No line of a reference solution (a code line of ``### BEGIN/END SOLUTION``, comments stripped, at least a few
  tokens long) appears in the released exercise cell's docstrings or comments (``notebooks/``, as students get it);
* the exercise cell is followed by a markdown cell with three collapsed hints, ``<details><summary>Hint 1`` … 3;
* the exercise's own markdown (the cells between the section heading and the exercise cell, hints excluded) names
  no solution *condition or expression* in code — the recipe belongs in the hints, the contract in the text.
"""
import ast
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

from autograder.exercises import all_exercises

REPO = Path(__file__).resolve().parents[2]
# Solution lines that the contract itself must name: an interface the grader or torch requires, not the answer.
CONTRACT_LINES = {"super().__init__(params, kwargs)", "super().add_param_group(param_group)",  # torch's Optimizer API
                  "optimizer.step()"}  # what train_with_accumulation's contract counts


def exercise_cells(folder: Path) -> dict[str, tuple[list[dict], int]]:
    """exercise name -> (the notebook's cells, the index of its exercise cell)."""
    found = {}
    for path in sorted(folder.rglob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        for i, cell in enumerate(cells):
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if cell["cell_type"] == "code" and grade_id in all_exercises():
                found[grade_id] = (cells, i)
    return found


SOLUTIONS = exercise_cells(REPO / "solutions")
RELEASED = exercise_cells(REPO / "notebooks")
NAMES = sorted(all_exercises())


def solution_lines(source: str) -> list[str]:
    """The reference's code lines, comments stripped, long enough to give something away."""
    regions = re.findall(r"### BEGIN SOLUTION(.*?)### END SOLUTION", source, re.S)
    lines = []
    for line in "\n".join(regions).splitlines():
        code = line.split("  #")[0].strip()
        if code and not code.startswith("#") and len(re.findall(r"\w+|[^\w\s]", code)) >= 5:
            lines.append(code)
    return lines


def normalised(text: str) -> str:
    return re.sub(r"\s+", "", text)


def comments_and_docstrings(source: str) -> str:
    texts = [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)) and ast.get_docstring(node):
            texts.append(ast.get_docstring(node))
    return "\n".join(texts)


@pytest.mark.parametrize("name", NAMES)
def test_no_solution_line_in_the_released_docstrings_and_comments(name):
    reference = "".join(SOLUTIONS[name][0][SOLUTIONS[name][1]]["source"])
    cells, i = RELEASED[name]
    released = "".join(cells[i]["source"])
    assert "### BEGIN SOLUTION" not in released and "raise NotImplementedError()" in released
    prose = normalised(comments_and_docstrings(released))
    leaked = [line for line in solution_lines(reference) if normalised(line) in prose]
    assert not leaked, f"{name}: the released cell's comments or docstrings contain the reference's lines: {leaked}"


@pytest.mark.parametrize("name", NAMES)
def test_three_collapsed_hints_follow_the_exercise_cell(name):
    cells, i = SOLUTIONS[name]
    hints = "".join(cells[i + 1]["source"]) if cells[i + 1]["cell_type"] == "markdown" else ""
    for n in (1, 2, 3):
        assert f"<details><summary>Hint {n}</summary>" in hints, f"{name}: no collapsed Hint {n} right below the exercise"
    assert hints.count("</details>") == 3


@pytest.mark.parametrize("name", NAMES)
def test_the_exercise_text_gives_no_solution_expression(name):
    cells, i = SOLUTIONS[name]
    start = max(j for j in range(i)
                if cells[j]["cell_type"] == "markdown" and re.search(r"^#+ ", "".join(cells[j]["source"]), re.M))
    text = "".join("".join(c["source"]) for c in cells[start:i] if c["cell_type"] == "markdown")
    text = re.sub(r"<details>.*?</details>", "", text, flags=re.S)
    spans = {normalised(s) for s in re.findall(r"`([^`]+)`", text)}
    expressions = set()
    for line in solution_lines("".join(cells[i]["source"])):
        if line in CONTRACT_LINES:
            continue
        core = re.sub(r"^(if|elif|while|return)\s+|:$", "", line)  # a condition or a returned expression itself
        expressions.add(normalised(core))
    given = sorted(s for s in spans if s in expressions and len(s) > 12)
    assert not given, f"{name}: the exercise text spells out the solution's code: {given} (move it to a hint)"


def test_the_checker_sees_an_answer_in_a_todo():
    reference = "def f(x):\n    ### BEGIN SOLUTION\n    return (x + 1) % k == 0\n    ### END SOLUTION\n"
    released = "def f(x):\n    # TODO: return (x + 1) % k == 0\n    raise NotImplementedError()\n"
    assert [line for line in solution_lines(reference) if normalised(line) in normalised(comments_and_docstrings(released))]
