"""Class grading runs on held-out scenarios: the reference results shipped in the student kit (public scenarios)
cannot be replayed for a grade.

A submission that looks its answers up in the installed ``references/gpipe_schedule.json`` (the sandbox lets a
student's cell read the grader's package, so it can) passes every public self-check and scores full marks when
the class is graded on the public scenarios, and earns nothing on the held-out ones the grader uses by default.
"""
import csv
import subprocess
import sys

import pytest
from submission_factory import filled, reference_source, write

from autograder.authoring.course import load_course
from autograder.grader.references import held_out_salt

NB, EX = "04_model_pipeline_parallel.ipynb", "gpipe_schedule"
REPLAY = '''
import json, pathlib, autograder
_OBS = json.loads((pathlib.Path(autograder.__file__).parent / "references" / "gpipe_schedule.json").read_text())
_TABLES = {(s["case"]["num_stages"], s["case"]["num_microbatches"]): s["table"]
           for s in _OBS["observation"]["scenarios"].values() if "table" in s}


def gpipe_schedule(num_stages, num_microbatches):
    """The shipped public reference table for these arguments, or nothing."""
    table = _TABLES.get((num_stages, num_microbatches), [])
    return [[tuple(slot) if isinstance(slot, list) else slot for slot in step] for step in table]
'''


def test_each_exercise_has_its_own_stable_held_out_salt():
    course = load_course()
    salts = {e: held_out_salt(course, e) for e in course.exercises}
    assert all(0 < s < 2**31 for s in salts.values())
    assert len(set(salts.values())) == len(salts), salts
    assert salts == {e: held_out_salt(course, e) for e in course.exercises}


def grade(submissions, out, *extra) -> dict[str, float]:
    run = subprocess.run([sys.executable, "-m", "autograder", "grade", str(submissions), "--out", str(out), "--quiet",
                          "--jobs", "2", "--notebook", NB, *extra], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(out / "grades.csv", newline="") as f:
        return {r["student"]: float(r["score"]) for r in csv.DictReader(f) if r["exercise"] == EX}


@pytest.mark.slow
def test_replaying_the_shipped_reference_earns_nothing_in_class_grading(tmp_path):
    notebook = filled(NB, {EX: reference_source(EX)})
    write(tmp_path / "in", "ada", NB, notebook)                     # the real thing
    write(tmp_path / "in", "rex", NB, filled(NB, {EX: REPLAY}))     # a lookup table of the shipped results
    public = grade(tmp_path / "in", tmp_path / "public", "--public-scenarios")
    held_out = grade(tmp_path / "in", tmp_path / "held-out")
    full = load_course().notebooks[NB].test_points[EX]
    assert public == {"ada": full, "rex": full}, "on the public scenarios the replay passes (that is the threat)"
    assert held_out["ada"] == full
    assert held_out["rex"] == 0, held_out
