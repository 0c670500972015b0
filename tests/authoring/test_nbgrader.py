"""The nbgrader round trip with real nbgrader: generate → release → fetch → submit → collect → autograde →
feedback → export, plus Validate, plus `python -m autograder grade --gradebook` landing in the same gradebook.

All instructor state goes to a temporary course root (NBGRADER_COURSE_ROOT), never into the repository.
"""
import csv
import json
import os
import sys
from pathlib import Path

import pytest
from lesson_runs import assert_blank_scores_zero, assert_full_marks, read
from nbgrader_cli import COURSE, NBGRADER, REPO, run
from submission_factory import reference_source

ASSIGNMENT, NB, EX = "lesson1", "01_gradient_accumulation.ipynb", "train_with_accumulation"
pytestmark = pytest.mark.slow


def fill(path: Path, source: str) -> None:
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == EX:
            cell["source"] = source
    path.write_text(json.dumps(nb, indent=1))


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    env = {**os.environ, "NBGRADER_COURSE_ROOT": str(root / "instructor"), "NBGRADER_EXCHANGE": str(root / "exchange"),
           "JUPYTER_DATA_DIR": str(root / "jupyter-data")}  # nbgrader's submission cache stays out of $HOME
    release = f"--CourseDirectory.release_directory={root / 'release'}"
    (root / "instructor").mkdir()
    (root / "exchange").mkdir(mode=0o777)
    os.chmod(root / "exchange", 0o777)
    run([NBGRADER, "generate_assignment", ASSIGNMENT, "--force", release], COURSE, env)
    # the class roster as a CSV, one nbgrader start (about 4 CPU-s each) for the whole class
    (root / "roster.csv").write_text("id,first_name,last_name\nalice,Alice,A\nbob,Bob,B\n")
    run([NBGRADER, "db", "student", "import", str(root / "roster.csv")], COURSE, env)
    run([NBGRADER, "release_assignment", ASSIGNMENT, "--force", release], COURSE, env)
    answers = {"alice": reference_source(EX), "bob": None}  # bob submits the notebook untouched
    for student, answer in answers.items():
        home = root / student
        home.mkdir()
        student_env = env
        exchange = f"--Exchange.root={root / 'exchange'}"
        run([NBGRADER, "fetch_assignment", ASSIGNMENT, "--course", "training-at-scale", exchange], home, student_env)
        if answer:
            fill(home / ASSIGNMENT / NB, answer)
        run([NBGRADER, "submit", ASSIGNMENT, "--course", "training-at-scale", exchange], home, student_env)
        # nbgrader names a submission after the OS account; the tests have one account, so rename it as the
        # exchange would have named a submission by a separate user.
        inbound = root / "exchange" / "training-at-scale" / "inbound"
        for entry in inbound.iterdir():
            if not entry.name.startswith(("alice+", "bob+")):
                entry.rename(inbound / f"{student}+{entry.name.split('+', 1)[1]}")
    run([NBGRADER, "collect", ASSIGNMENT], COURSE, env)
    run([NBGRADER, "autograde", ASSIGNMENT, "--force"], COURSE, env)
    run([NBGRADER, "generate_feedback", ASSIGNMENT, "--force"], COURSE, env)
    run([NBGRADER, "export", f"--to={root / 'export.csv'}"], COURSE, env)
    return root, env


def scores(csv_path: Path) -> dict[str, float]:
    with open(csv_path, newline="") as f:
        return {r["student_id"]: float(r["raw_score"]) for r in csv.DictReader(f)}


def test_autograde_full_marks_for_solution_zero_for_blank(round_trip):
    """Alice's notebook is the solution notebook, bob's the released one: their autograde is also Lesson 1's run top
    to bottom, as the instructor has it and as a student gets it (lesson_runs.py; test_notebooks.py has the others)."""
    root, _ = round_trip
    got = scores(root / "export.csv")
    assert got["alice"] == 11.0 and got["bob"] == 0.0, got
    with open(root / "export.csv", newline="") as f:  # the graded students are the roster's
        assert {r["student_id"]: r["first_name"] for r in csv.DictReader(f)} == {"alice": "Alice", "bob": "Bob"}
    autograded = root / "instructor" / "autograded"
    assert_full_marks(read(autograded / "alice" / ASSIGNMENT / NB), f"{NB} (the reference, autograded)")
    assert_blank_scores_zero(read(autograded / "bob" / ASSIGNMENT / NB), f"{NB} (as released, autograded)")


def test_feedback_shows_the_check_report(round_trip):
    root, _ = round_trip
    (alice,) = (root / "instructor" / "feedback" / "alice" / ASSIGNMENT).glob("*.html")
    html = alice.read_text()
    assert "train_with_accumulation: 11 / 11 points" in html
    (bob,) = (root / "instructor" / "feedback" / "bob" / ASSIGNMENT).glob("*.html")
    assert "NotImplementedError" in bob.read_text()


def test_validate_passes_solution_and_flags_blank(round_trip):
    root, env = round_trip
    ok = run([NBGRADER, "validate", str(root / "alice" / ASSIGNMENT / NB)], COURSE, env)
    assert "Success! Your notebook passes all the tests." in ok.stdout, ok.stdout
    blank = run([NBGRADER, "validate", str(root / "bob" / ASSIGNMENT / NB)], COURSE, env, check=False)
    assert "VALIDATION FAILED" in blank.stdout, blank.stdout
    # the check's own report, not nbgrader's "Partial credit; passed some but not all of the tests" (issue 27)
    assert "Partial credit" not in blank.stdout and f"{EX}: 0 / 11 points" in blank.stdout, blank.stdout
    assert "NotImplementedError" in blank.stdout, blank.stdout


def test_class_grader_writes_the_same_gradebook(round_trip, tmp_path):
    """`python -m autograder grade --gradebook` on nbgrader's submitted/ folder: same scores in nbgrader's export."""
    root, env = round_trip
    env = {**env, "NBGRADER_COURSE_ROOT": str(tmp_path / "instructor")}  # a fresh gradebook
    (tmp_path / "instructor").mkdir()
    submitted = root / "instructor" / "submitted"
    run([sys.executable, "-m", "autograder", "grade", str(submitted), "--out", str(tmp_path / "out"), "--quiet",
         "--gradebook"], REPO, env)
    run([NBGRADER, "export", f"--to={tmp_path / 'export.csv'}"], COURSE, env)
    assert scores(tmp_path / "export.csv") == scores(root / "export.csv")
    autograded = json.loads((tmp_path / "instructor" / "autograded" / "alice" / ASSIGNMENT / NB).read_text())
    report = [c for c in autograded["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == f"test_{EX}"]
    assert "11 / 11 points" in report[0]["outputs"][0]["text"]
    run([NBGRADER, "generate_feedback", ASSIGNMENT, "--force"], COURSE, env)
    assert list((tmp_path / "instructor" / "feedback" / "alice" / ASSIGNMENT).glob("*.html"))
