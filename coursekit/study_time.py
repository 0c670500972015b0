"""How long a lesson takes to study, computed from its material by one stated formula.

    minutes = words / 150 + code lines / 15 + 3 × predictions + 25 × exercises, rounded up to 5 minutes

* words: the prose of the markdown cells (hints included), read carefully, as technical text is, at 150 a minute;
* code lines: the non-blank lines of the code cells a student reads and runs, 15 a minute (a graded cell's
  reference solution is not counted: the student writes it, inside the exercise's time);
* predictions: each ``my_… = None`` cell, 3 minutes (work it out, write it down, read the comparison);
* exercises: each graded exercise, 25 minutes (write it, run the checks, fix it).

The start page's table and the line under each lesson's title state the result; ``python -m coursekit.study_time``
prints every lesson's (``--write`` puts them into solutions/), and a test fails when a notebook states another
number.
"""
import json
import math
import re
import sys
from pathlib import Path

WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE, MINUTES_PER_PREDICTION, MINUTES_PER_EXERCISE = 150, 15, 3, 25
STATED = re.compile(r"study time about (\d+) minutes")  # how a lesson states it under its title
PREDICTION = re.compile(r"^my_\w+ = None\b", re.M)
# "[ ]" keeps nbgrader's markers themselves out of this file, which ships to students
SOLUTION = re.compile(r"### BEGIN[ ]SOLUTION.*?### END[ ]SOLUTION", re.S)


def material(notebook: Path) -> dict[str, int]:
    """The counts the formula uses, for one lesson notebook."""
    cells = json.loads(notebook.read_text())["cells"]
    words = code = predictions = exercises = 0
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            words += len(STATED.sub("", text).split())  # the stated time itself is not material
            continue
        grading = cell.get("metadata", {}).get("nbgrader", {})
        if grading.get("grade"):
            continue  # a test cell: `check(...)`, nothing to read
        exercises += bool(grading.get("solution"))
        predictions += len(PREDICTION.findall(text))
        code += sum(1 for line in SOLUTION.sub("", text).splitlines() if line.strip())
    return {"words": words, "code lines": code, "predictions": predictions, "exercises": exercises}


def study_minutes(notebook: Path) -> int:
    """The formula above, rounded up to 5 minutes."""
    m = material(notebook)
    minutes = (m["words"] / WORDS_PER_MINUTE + m["code lines"] / CODE_LINES_PER_MINUTE
               + MINUTES_PER_PREDICTION * m["predictions"] + MINUTES_PER_EXERCISE * m["exercises"])
    return 5 * math.ceil(minutes / 5)


def start_page_row(notebook: Path) -> re.Pattern:
    """The start page's table row of a lesson: its link, then the study time in the last column."""
    link = re.escape(f"({notebook.parent.name}/{notebook.name})")
    return re.compile(rf"^(\|[^\n]*{link}[^\n]*\| about )(\d+)( min \|)$", re.M)


def write(root: Path) -> None:
    """Put each lesson's computed study time under its title and into the start page's table."""
    start_page = root / "00-start-here.ipynb"
    start = json.loads(start_page.read_text())
    for notebook in sorted(root.glob("lesson*/*.ipynb")):
        minutes = study_minutes(notebook)
        nb = json.loads(notebook.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                cell["source"] = [STATED.sub(f"study time about {minutes} minutes", line) for line in cell["source"]]
        notebook.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        for cell in start["cells"]:
            if cell["cell_type"] == "markdown":
                cell["source"] = [start_page_row(notebook).sub(rf"\g<1>{minutes}\g<3>", line) for line in cell["source"]]
    start_page.write_text(json.dumps(start, indent=1, ensure_ascii=False) + "\n")


def main(argv: list[str]) -> None:
    root = Path(__file__).resolve().parent.parent / "solutions"
    if "--write" in argv:
        write(root)
    for notebook in sorted(root.glob("lesson*/*.ipynb")):
        counts = ", ".join(f"{v:,} {k}" for k, v in material(notebook).items())
        print(f"{notebook.name}: about {study_minutes(notebook)} minutes ({counts})")


if __name__ == "__main__":
    main(sys.argv[1:])
