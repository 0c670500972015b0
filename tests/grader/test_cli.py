"""`python -m autograder grade` end to end, as an instructor runs it: contract, malformed input, repeatability,
the same grades on a Dask cluster.

Runs the real CLI in a subprocess on a small class of Lesson 1 submissions; the workers are sandboxed
(bubblewrap when the machine has it).
"""
import csv
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from submission_factory import filled, reference_source, released_notebook, write
from variants.train_with_accumulation import WRONG

from autograder.grader.escape import file_stem

NB = "01_gradient_accumulation.ipynb"
EX = "train_with_accumulation"
pytestmark = pytest.mark.slow


def grade(submissions, out, *extra):
    run = subprocess.run([sys.executable, "-m", "autograder", "grade", str(submissions), "--out", str(out),
                          "--quiet", "--jobs", "2", *extra], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def rows(out):
    with open(out / "grades.csv", newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


def _without_cell(grade_id):
    nb = released_notebook(NB)
    nb["cells"] = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") != grade_id]
    return nb


def _duplicated_cell():
    nb = filled(NB, {EX: reference_source(EX)})
    cell = next(c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == EX)
    nb["cells"].append(cell)
    return nb


CLASS = {  # student: (file name, content, expected score or None for "0 with this reason")
    "alice": (NB, lambda: filled(NB, {EX: reference_source(EX)}), "full", ""),
    "bob": (NB, lambda: released_notebook(NB), 0, "NotImplementedError"),
    "carol": (NB, lambda: b"{ this is not json", 0, "not valid notebook JSON"),
    "dave": ("my lesson 1.ipynb", lambda: filled(NB, {EX: reference_source(EX)}), "full", "please keep the released file name"),
    "erin": (NB, lambda: b"", 0, "empty"),
    "frank": (NB, lambda: {**filled(NB, {EX: reference_source(EX)}), "nbformat": 3}, 0, "nbformat 3"),
    "gina": (NB, lambda: _without_cell(EX), 0, "is missing"),
    "hank": (NB, _duplicated_cell, 0, "appears 2 times"),
    "ivan": (NB, lambda: filled(NB, {EX: "def train(model, loader, opt, crit, k=4):\n    return 0.0\n"}), 0, "is not defined"),
    "jack": (NB, lambda: filled(NB, {EX: "1 / 0\n" + reference_source(EX)}), 0, "ZeroDivisionError"),
    "kate": (NB, lambda: filled(NB, {EX: WRONG["no_division_by_k"][0]}), "partial", "divide each micro-batch's loss"),
    "liam": (NB, lambda: filled(NB, {EX: "def train_with_accumulation(:\n"}), 0, "syntax error"),
    "mona": ("notes.txt.ipynb", lambda: {"nbformat": 4, "cells": []}, 0, "No notebook 01_gradient_accumulation.ipynb"),
}


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    submissions = tmp_path_factory.mktemp("submissions")
    for student, (file, make, _, _) in CLASS.items():
        write(submissions, student, file, make())
    out = tmp_path_factory.mktemp("out")
    run = grade(submissions, out)
    return submissions, out, run


def test_contract_one_row_per_student_and_exercise(graded_class):
    _, out, _ = graded_class
    with open(out / "grades.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames[:6] == ["student", "notebook", "exercise", "score", "max_score", "feedback"]
        table = list(reader)
    assert sorted(r["student"] for r in table) == sorted(CLASS)
    assert {(r["notebook"], r["exercise"]) for r in table} == {(NB, EX)}


@pytest.mark.parametrize("student", sorted(CLASS))
def test_each_submission_scored_with_reason(graded_class, student):
    _, out, _ = graded_class
    row = rows(out)[student]
    _, _, expected, reason = CLASS[student]
    score, max_score = float(row["score"]), float(row["max_score"])
    if expected == "full":
        assert score == max_score, row
    elif expected == "partial":
        assert 0 < score < max_score, row
    else:
        assert score == 0, row
    assert reason in row["feedback"], row


def test_feedback_and_summary_files(graded_class):
    _, out, run = graded_class
    index = {r["student"]: r for r in csv.DictReader(open(out / "feedback" / "index.csv", newline=""))}
    for student in CLASS:
        assert index[student]["markdown"] == f"{file_stem(student)}.md"
        assert (out / "feedback" / f"{file_stem(student)}.md").read_text().startswith(f"# Feedback for {student}")
        assert "<h1>Feedback for" in (out / "feedback" / f"{file_stem(student)}.html").read_text()
    summary = list(csv.DictReader(open(out / "summary.csv", newline="")))
    assert [r["student"] for r in summary] == sorted(CLASS)
    assert [r["name"] for r in summary] == sorted(CLASS)  # a plain folder's name is the student id
    assert {r["percent"] for r in summary if r["student"] == "alice"} == {"100.0"}
    assert "13 students" in run.stdout


def test_same_submissions_same_file_and_resume(graded_class, tmp_path):
    submissions, out, _ = graded_class
    again = tmp_path / "again"
    grade(submissions, again)
    assert (again / "grades.csv").read_bytes() == (out / "grades.csv").read_bytes()
    assert (again / "summary.csv").read_bytes() == (out / "summary.csv").read_bytes()
    # An interrupted run: two students' saved results are lost, the reports were never written.
    states = sorted((again / ".state").glob("*.json"))
    for lost in states[:2]:
        lost.unlink()
    (again / "grades.csv").unlink()
    grade(submissions, again)
    summary = json.loads((again / "run.json").read_text())
    assert summary["resumed"] == len(CLASS) - 2
    assert (again / "grades.csv").read_bytes() == (out / "grades.csv").read_bytes()


def test_lms_zip_download(graded_class, tmp_path):
    """A Canvas zip (flat files <lastfirst>[_LATE]_<user id>_<submission id>_<notebook>) grades like the folder,
    keyed by the Canvas user id with the name beside it; two students with one name stay two students."""
    submissions, out, _ = graded_class
    archive = tmp_path / "submissions.zip"
    ids = {"alice": 1001, "bob": 1002, "kate": 1003}
    with zipfile.ZipFile(archive, "w") as z:
        for student, user_id in ids.items():
            z.writestr(f"{student}_{user_id}_{user_id + 5000}_{NB}", (submissions / student / NB).read_bytes())
        z.writestr(f"carol_LATE_1004_6004_{NB.replace('.ipynb', '-1.ipynb')}", b"{ this is not json")
        z.writestr(f"alice_1005_6005_{NB}", (submissions / "bob" / NB).read_bytes())  # another alice, blank
    zipped = tmp_path / "zipped"
    grade(archive, zipped)
    got, want = rows(zipped), rows(out)
    assert sorted((s, r["name"]) for s, r in got.items()) == [
        ("1001", "alice"), ("1002", "bob"), ("1003", "kate"), ("1004", "carol"), ("1005", "alice")]
    for user_id, row in got.items():
        expected = want["bob"] if user_id == "1005" else want[row["name"]]
        assert row["score"] == expected["score"], row


def test_dask_gives_the_same_grades(graded_class, tmp_path):
    """The same class grading on a Dask cluster (a real local one: scheduler + 2 worker processes) gives the rows the
    threads gave: a reference, a blank and a wrong answer of the class above (its threads run is the comparison)."""
    submissions, out, _ = graded_class
    for student in ("alice", "bob", "kate"):
        shutil.copytree(submissions / student, tmp_path / "in" / student)
    grade(tmp_path / "in", tmp_path / "dask", "--dask", "local")
    with open(tmp_path / "dask" / "grades.csv", newline="") as f, open(out / "grades.csv", newline="") as g:
        dask, threads = csv.DictReader(f), csv.DictReader(g)
        assert list(dask) == [r for r in threads if r["student"] in ("alice", "bob", "kate")]
        assert dask.fieldnames == threads.fieldnames
    assert rows(tmp_path / "dask")["alice"]["score"] == "11"


def test_missing_folder_is_a_clear_error(tmp_path):
    run = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp_path / "nope"), "--out",
                          str(tmp_path / "out")], capture_output=True, text=True)
    assert run.returncode == 2 and "does not exist" in run.stderr


def test_rlimits_fallback_says_so(graded_class, tmp_path):
    """Without bubblewrap on PATH the grader still grades, and warns that isolation is reduced."""
    submissions, out, _ = graded_class
    alice_only = tmp_path / "one"
    write(alice_only, "alice", NB, (submissions / "alice" / NB).read_bytes())
    run = subprocess.run([sys.executable, "-m", "autograder", "grade", str(alice_only), "--out", str(tmp_path / "o"),
                          "--quiet"], capture_output=True, text=True, timeout=600,
                         env={"PATH": os.path.dirname(sys.executable), "HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    assert "bubblewrap (bwrap) is not installed" in run.stderr
    assert rows(tmp_path / "o")["alice"]["score"] == rows(out)["alice"]["score"]
    # bubblewrap is back: the result graded without isolation is not resumed, it is graded again
    again = grade(alice_only, tmp_path / "o")
    summary = json.loads((tmp_path / "o" / "run.json").read_text())
    assert summary["resumed"] == 0 and summary["regraded"] == 1, summary
    assert "graded again" in again.stderr and "isolation: bubblewrap" in again.stdout


def test_every_exercise_solution_full_blank_zero(tmp_path, course):
    """Across the whole course: the reference solutions score full, the released notebooks score 0."""
    graded = [spec for spec in course.notebooks.values() if spec.exercises]
    for spec in graded:
        write(tmp_path / "in", "solutions", spec.name,
              filled(spec.name, {e: reference_source(e) for e in spec.exercises}))
        write(tmp_path / "in", "untouched", spec.name, released_notebook(spec.name))
    grade(tmp_path / "in", tmp_path / "out")
    with open(tmp_path / "out" / "grades.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert {r["exercise"] for r in table} == set(course.exercises)
    for row in table:
        expected = row["max_score"] if row["student"] == "solutions" else "0"
        assert row["score"] == expected, row


def test_each_notebook_is_read_once_a_run(tmp_path, monkeypatch):
    """Grading and the class report's similar-submissions search use the cells read once per submission's notebook
    (grading.read_notebooks), not a second parse each; the copied pair is still found."""
    from autograder.grader import grading, notebook
    from autograder.grader.batch import grade_class
    from autograder.grader.sandbox.launch import make_sandbox

    nb, ex = "01_gradient_accumulation.ipynb", "train_with_accumulation"
    for student in ("ada", "bob"):
        write(tmp_path / "in", student, nb, filled(nb, {ex: reference_source(ex)}))
    write(tmp_path / "in", "cy", nb, released_notebook(nb))
    reads = []
    real = notebook.exercise_cells

    def counted(nb_, spec):
        reads.append(spec.name)
        return real(nb_, spec)
    for module in (grading, notebook):  # wherever a module of the run looks it up
        monkeypatch.setattr(module, "exercise_cells", counted)
    rows, summary = grade_class(tmp_path / "in", tmp_path / "out", make_sandbox(), jobs=2, progress=False)
    assert reads == [nb] * 3
    assert {r.student: r.score for r in rows} == {"ada": 11.0, "bob": 11.0, "cy": 0.0}
    similar = list(csv.DictReader(open(tmp_path / "out" / "similar.csv", newline="")))
    assert [(p["student_a"], p["student_b"]) for p in similar] == [("ada", "bob")]
