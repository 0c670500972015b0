"""Grading speed: plain serial `nbgrader autograde` against `python -m autograder grade`, side by side.

    python -m bench.grading [--students 100] [--nbgrader-sample 3] [--jobs N]
    python -m bench.grading --students 45 --baseline /tmp/old-checkout --baseline-python PY [--repeat 2]
        [--notebooks 01_gradient_accumulation.ipynb ...]   (only these: the ones both versions grade)


Builds a class of submissions covering every graded notebook — a third correct (the reference), a third
partly done (every other exercise solved, the rest as released), a third broken (untouched, invalid JSON, deleted
cell) — then:

* grades all of them with the isolated, parallel class grader and reads its per-phase times;
* grades a sample with plain nbgrader (serial by design; it runs every cell of every lesson), and
  extrapolates its per-student time to the whole class, saying so. `--nbgrader-sample 0` grades them all.

Prints both, the ratio, and the workers' peak memory. Timings come from one run on this machine.

``--baseline CHECKOUT`` also grades the same submissions with another version of the grader (e.g. an older
commit in a ``git worktree``, run by ``--baseline-python``, a venv whose editable install points there),
alternating the two ``--repeat`` times so both see the same machine load, and reports the per-student
times and their ratio (median of the runs); nbgrader is not run then.
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

from autograder.authoring.class_builder import filled, reference_source, released_notebook, write
from autograder.authoring.course import classroom_dir, load_course
from coursekit import describe_device

REPO = Path(__file__).resolve().parent.parent


def build_class(folder: Path, students: int, seed: int = 0, notebooks: list[str] | None = None,
                correct_only: bool = False) -> dict[str, str]:
    """Write the submissions (of ``notebooks``, or of every graded one); returns each student's kind."""
    rng = random.Random(seed)
    course = load_course()
    graded = [spec for spec in course.notebooks.values() if spec.exercises and (not notebooks or spec.name in notebooks)]
    kinds = {}
    for i in range(students):
        student, kind = f"s{i:03d}", "correct" if correct_only else ("correct", "partly done", "broken")[i % 3]
        kinds[student] = kind
        for spec in graded:
            answers = {}
            for j, exercise in enumerate(spec.exercises):
                # partly done: every other exercise, alternating between students so each is solved by half of them
                if kind == "correct" or (kind == "partly done" and (i // 3 + j) % 2 == 0):
                    answers[exercise] = reference_source(exercise)
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


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy so far (every core; /proc/stat). A run's own processes are not
    all countable from here (a sandbox's PID namespace ends killed, its processes reaped by no one we wait for), so
    the bench counts the machine's: run it on a machine with nothing else to do."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_group() -> Path | None:
    """A cpuacct group (cgroup v1, as root) for one graded run: it counts the CPU time of the grader and of every
    process it starts (sandboxes, ranks, however they end) and nothing else, so a machine shared with other work
    still gives the run's own cost. None where there is no such hierarchy or it is not writable."""
    own = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                if "cpuacct" in line.split(":", 2)[1].split(",")), None)
    root = Path("/sys/fs/cgroup/cpuacct")
    if own is None or not (root / "cpuacct.usage").exists():
        return None
    group = root / own.lstrip("/") / f"bench-grading-{os.getpid()}-{time.monotonic_ns()}"
    try:
        group.mkdir()
    except OSError:
        return None
    return group


def _own_cpu_s(group: Path | None) -> float | None:
    """The group's CPU seconds; the group is removed once its last process has ended."""
    if group is None:
        return None
    used = int((group / "cpuacct.usage").read_text()) / 1e9
    for _ in range(50):
        try:
            group.rmdir()
            break
        except OSError:  # a sandbox's last processes are still going away
            time.sleep(0.1)
    return used


def time_class_grader(submissions: Path, out: Path, jobs: int, python: str = sys.executable, cwd: Path = REPO) -> dict:
    group = _own_cpu_group()
    started, cpu_before = time.perf_counter(), _machine_busy_s()
    subprocess.run([python, "-m", "autograder", "grade", str(submissions), "--out", str(out), "--quiet",
                    "--jobs", str(jobs), "--fresh"], check=True, cwd=cwd,
                   env={**os.environ, "PATH": f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                        "PYTHONPATH": str(cwd)},  # that checkout's grader, whatever the venv's install points at
                   preexec_fn=(lambda: (group / "cgroup.procs").write_text(str(os.getpid()))) if group else None)
    cpu_s, own_cpu_s = _machine_busy_s() - cpu_before, _own_cpu_s(group)
    run = json.loads((out / "run.json").read_text())
    return {"wall_s": time.perf_counter() - started, "cpu_s": cpu_s, "own_cpu_s": own_cpu_s, **run}


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
    course_dir = classroom_dir()
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
    parser.add_argument("--baseline", type=Path, help="another checkout of the grader to compare with, side by side")
    parser.add_argument("--baseline-python", default=sys.executable, help="the interpreter that runs --baseline")
    parser.add_argument("--repeat", type=int, default=2, help="alternating runs of each grader with --baseline")
    parser.add_argument("--notebooks", nargs="*", help="only these notebooks (with --baseline: those both grade)")
    parser.add_argument("--correct-only", action="store_true", help="every student submits the reference")
    args = parser.parse_args()
    if args.baseline:
        compare(args)
        return

    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        tmp = Path(tmp)
        kinds = build_class(tmp / "submissions", args.students, notebooks=args.notebooks, correct_only=args.correct_only)
        ours = time_class_grader(tmp / "submissions", tmp / "out", args.jobs)
        # nbgrader's sample: the first students in order, which cycles correct, partly done, broken (like the class)
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


def compare(args) -> None:
    """This grader against ``--baseline`` on the same class, alternating, so both see the same load.

    Per run: the wall time per student (the command's, reports included), and the cost per student-exercise in
    core-seconds, three ways: the grading time the summary line states less its one-time reference run, times the
    jobs (the workers keep the cores busy); the workers' own time (``run_s``: no one-time cost at all); and the CPU
    seconds the machine was busy during the run (grader, workers, ranks; the reference run included, so a grader
    with costlier references pays for them), which time spent waiting for a core does not inflate; and, as root with
    cgroup v1, the CPU seconds of the run's own processes alone (the same, reference run included), which other work
    on a shared machine does not inflate either (0 where it cannot be measured). Each run records the load average."""
    import statistics

    course = load_course()
    exercises = sum(len(spec.exercises) for spec in course.notebooks.values()
                    if spec.exercises and (not args.notebooks or spec.name in args.notebooks))
    per_exercise = args.students * exercises
    runs = {"this": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        tmp = Path(tmp)
        build_class(tmp / "submissions", args.students, notebooks=args.notebooks, correct_only=args.correct_only)
        for i in range(args.repeat):
            for name, python, cwd in (("baseline", args.baseline_python, args.baseline), ("this", sys.executable, REPO)):
                result = time_class_grader(tmp / "submissions", tmp / f"out-{name}-{i}", args.jobs, python, cwd)
                phases = result["phases"]
                runs[name].append({
                    "load_average_1min": round(os.getloadavg()[0], 2),  # others' load: compare only runs side by side
                    "per_student_s": result["wall_s"] / args.students,
                    "core_s_per_student_exercise": (result["seconds"] - phases["reference_s"]) * args.jobs / per_exercise,
                    "worker_s_per_student_exercise": phases["run_s"] / per_exercise,
                    "cpu_s_per_student_exercise": result["cpu_s"] / per_exercise,
                    "own_cpu_s_per_student_exercise": (result["own_cpu_s"] or 0.0) / per_exercise})
                print(f"run {i + 1} {name}: {result['wall_s']:.1f} s for {args.students} students "
                      f"({runs[name][-1]['per_student_s']:.2f} s per student, "
                      f"{runs[name][-1]['core_s_per_student_exercise']:.3f} core-s and "
                      f"{runs[name][-1]['cpu_s_per_student_exercise']:.3f} CPU-s (machine) and "
                      f"{runs[name][-1]['own_cpu_s_per_student_exercise']:.3f} CPU-s (own) per student-exercise; "
                      f"load average {runs[name][-1]['load_average_1min']}; "
                      f"isolation: {result['isolation']})", flush=True)
    figures = ("per_student_s", "core_s_per_student_exercise", "worker_s_per_student_exercise",
               "cpu_s_per_student_exercise", "own_cpu_s_per_student_exercise")
    median = {k: {f: statistics.median(r[f] for r in v) for f in figures} for k, v in runs.items()}
    result = {"machine": describe_device("cpu"), "students": args.students, "exercises_per_student": exercises,
              "jobs": args.jobs, "notebooks": args.notebooks or "all",
              "runs": {k: [{f: round(r[f], 3) for f in ("load_average_1min", *figures)} for r in v]
                       for k, v in runs.items()},
              "median": {k: {f: round(x, 3) for f, x in v.items()} for k, v in median.items()},
              "ratio_this_to_baseline": {f: round(median["this"][f] / median["baseline"][f], 3) for f in figures
                                         if median["baseline"][f]}}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
