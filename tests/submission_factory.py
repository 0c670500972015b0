"""Build submitted notebooks the way students produce them (autograder.authoring.class_builder), and grade a small class."""
from pathlib import Path

from autograder.authoring.class_builder import filled, reference_source, released_notebook, write  # noqa: F401  (re-exported)


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
