"""Build submitted notebooks the way students produce them: the released notebook with cells filled in."""
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def released_notebook(name: str) -> dict:
    """The student version of a notebook, as released (from notebooks/)."""
    (path,) = [p for p in (REPO / "notebooks").rglob(name) if ".ipynb_checkpoints" not in p.parts]
    return json.loads(path.read_text())


def reference_source(exercise: str) -> str:
    from autograder.course import load_course

    return load_course().spec_for_exercise(exercise).reference_code[exercise]


def filled(notebook: str, answers: dict[str, str]) -> dict:
    """The released notebook with each exercise cell (by grade_id) replaced by the given source."""
    nb = released_notebook(notebook)
    for cell in nb["cells"]:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell["source"] = answers[grade_id]
    return nb


def write(folder: Path, student: str, notebook: str, content: dict | bytes | str) -> Path:
    path = folder / student / notebook
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, dict):
        content = json.dumps(content, indent=1)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def grade_one_exercise_class(tmp_path: Path, notebook: str, exercise: str, answers: dict[str, str | None]) -> dict:
    """`python -m autograder grade` (sandboxed, 2 jobs) on a small class: each student's notebook has ``answers[s]``
    as the exercise cell, or is the released notebook when None. Returns the exercise's grades.csv rows by student."""
    import csv
    import subprocess
    import sys

    submissions, out = tmp_path / "submissions", tmp_path / "out"
    for student, source in answers.items():
        content = released_notebook(notebook) if source is None else filled(notebook, {exercise: source})
        write(submissions, student, notebook, content)
    run = subprocess.run([sys.executable, "-m", "autograder", "grade", str(submissions), "--out", str(out), "--quiet",
                          "--jobs", "2", "--notebook", notebook], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(out / "grades.csv", newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f) if r["exercise"] == exercise}
