"""Grading speed: plain serial `nbgrader autograde` against `python -m autograder grade`, side by side.

    python -m bench.grading [--students 100] [--nbgrader-sample 3] [--jobs N]

Builds a class of submissions covering every graded notebook — a third correct (the reference), a third
plausible mistakes (from tests/variants), a third broken (untouched, invalid JSON, deleted cell) — then:

* grades all of them with the isolated, parallel class grader and reads its per-phase times;
* grades a sample with plain nbgrader (serial by design; it runs every cell of every lesson), and
  extrapolates its per-student time to the whole class, saying so. `--nbgrader-sample 0` grades them all.

Prints both, the ratio, and the workers' peak memory. Timings come from one run on this machine.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the variant suites and the submission factory live with the tests

from submission_factory import filled, reference_source, released_notebook, write  # noqa: E402

from autograder.course import load_course  # noqa: E402
from coursekit import describe_device  # noqa: E402


def build_class(folder: Path, students: int, seed: int = 0) -> dict[str, str]:
    """Write the submissions; returns each student's kind."""
    import importlib

    rng = random.Random(seed)
    course = load_course()
    graded = [spec for spec in course.notebooks.values() if spec.exercises]
    kinds = {}
    for i in range(students):
        student, kind = f"s{i:03d}", ("correct", "wrong", "broken")[i % 3]
        kinds[student] = kind
        for spec in graded:
            answers = {}
            for exercise in spec.exercises:
                if kind == "correct":
                    answers[exercise] = reference_source(exercise)
                elif kind == "wrong":
                    wrong = importlib.import_module(f"variants.{exercise}").WRONG
                    answers[exercise] = wrong[rng.choice(sorted(wrong))][0]
            if kind != "broken":
                write(folder, student, spec.name, filled(spec.name, answers))
                continue
            damage = rng.choice(("untouched", "invalid json", "deleted cell"))
            nb = released_notebook(spec.name)
            if damage == "invalid json":
                write(folder, student, spec.name, b'{"cells": [')
            else:
                if damage == "deleted cell":
                    nb["cells"] = [c for c in nb["cells"]
                                   if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") not in spec.exercises]
                write(folder, student, spec.name, nb)
    return kinds


def time_class_grader(submissions: Path, out: Path, jobs: int) -> dict:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autograder", "grade", str(submissions), "--out", str(out),
                    "--jobs", str(jobs), "--fresh"], check=True)
    run = json.loads((out / "run.json").read_text())
    return {"wall_s": time.perf_counter() - started, **run}


def time_nbgrader(submissions: Path, students: list[str], workdir: Path) -> dict:
    """nbgrader autograde, serially, every assignment, for the given students (the way nbgrader runs)."""
    course = load_course()
    root = workdir / "instructor"
    env = {**os.environ, "NBGRADER_COURSE_ROOT": str(root), "JUPYTER_DATA_DIR": str(workdir / "jupyter-data"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # nbgrader runs alembic
    nbgrader = str(Path(sys.executable).with_name("nbgrader"))
    for spec in course.notebooks.values():
        if not spec.exercises:
            continue
        for student in students:
            source = submissions / student / spec.name
            if source.exists():
                target = root / "submitted" / student / spec.assignment / spec.name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
    course_dir = REPO / "autograder" / "course"
    assignments = sorted({spec.assignment for spec in course.notebooks.values() if spec.exercises})
    for assignment in assignments:  # nbgrader grades only assignments its gradebook knows (not timed)
        subprocess.run([nbgrader, "generate_assignment", assignment, "--force",
                        f"--CourseDirectory.release_directory={workdir / 'release'}"],
                       cwd=course_dir, env=env, capture_output=True, check=True)
    started = time.perf_counter()
    per_assignment, failed = {}, 0
    for assignment in assignments:
        t = time.perf_counter()
        # nbgrader exits non-zero when some submissions could not be graded (the broken ones): that is data here
        done = subprocess.run([nbgrader, "autograde", assignment, "--force", "--create"], cwd=course_dir, env=env,
                              capture_output=True, text=True)
        failed += done.stdout.count("[AutogradeApp | ERROR]") + done.stderr.count("[AutogradeApp | ERROR]")
        per_assignment[assignment] = time.perf_counter() - t
    return {"wall_s": time.perf_counter() - started, "students": len(students), "per_assignment_s": per_assignment,
            "error_lines": failed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--nbgrader-sample", type=int, default=3, help="students nbgrader grades (0: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        tmp = Path(tmp)
        kinds = build_class(tmp / "submissions", args.students)
        ours = time_class_grader(tmp / "submissions", tmp / "out", args.jobs)
        # nbgrader's sample: the first students in order, which cycles correct, wrong, broken (like the class)
        sample = sorted(kinds)[: args.nbgrader_sample or args.students]
        theirs = time_nbgrader(tmp / "submissions", sample, tmp)

    per_student_nbgrader = theirs["wall_s"] / theirs["students"]
    nbgrader_class_s = per_student_nbgrader * args.students
    ratio = nbgrader_class_s / ours["wall_s"]
    result = {
        "machine": describe_device("cpu"), "students": args.students, "jobs": args.jobs,
        "class_grader": {"wall_s": round(ours["wall_s"], 1), "phases_s": ours["phases"],
                         "isolation": ours["isolation"], "worker_peak_mib": ours["phases"].get("worker_peak_mib")},
        "nbgrader": {"graded_students": theirs["students"], "wall_s": round(theirs["wall_s"], 1),
                     "error_lines": theirs["error_lines"],
                     "per_student_s": round(per_student_nbgrader, 1),
                     "per_assignment_s": {k: round(v, 1) for k, v in theirs["per_assignment_s"].items()},
                     "class_s": round(nbgrader_class_s, 1),
                     "class_s_is": "measured" if theirs["students"] == args.students else
                     f"extrapolated from {theirs['students']} students"},
        "speedup": round(ratio, 1),
    }
    print(json.dumps(result, indent=2))
    print(f"\n{args.students} submissions: class grader {ours['wall_s']:.0f} s (isolated, {args.jobs} jobs) vs "
          f"serial nbgrader {nbgrader_class_s:.0f} s ({result['nbgrader']['class_s_is']}): {ratio:.1f}x faster")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
