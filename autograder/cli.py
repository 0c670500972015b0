"""Instructor command line: ``python -m autograder {grade,report,generate,references,student-kit}``."""
import argparse
import os
import sys
from pathlib import Path


def _grade(args) -> int:
    from .grader.batch import grade_class
    from .grader.escape import terminal
    from .grader.outputs import STATE
    from .grader.sandbox.launch import Limits, WorkersCannotStart, make_sandbox
    from .grader.submissions import SubmissionsError

    if not Path(args.submissions).exists():
        print(f"error: {terminal(args.submissions)} does not exist", file=sys.stderr)
        return 2
    gib = 1 << 30
    limits = Limits(memory_bytes=int(args.memory_gb * gib),
                    total_memory_bytes=int((args.total_memory_gb or max(args.memory_gb, 4.0)) * gib))
    try:
        sandbox = make_sandbox(not args.no_sandbox, limits, gpu=not args.cpu_only)
    except WorkersCannotStart as exc:
        print(f"error: {terminal(str(exc))}", file=sys.stderr)
        return 2
    if sandbox.warning:
        print(sandbox.warning, file=sys.stderr)
    out = Path(args.out)
    if args.fresh and (out / STATE).exists():
        import shutil

        shutil.rmtree(out / STATE)
    try:
        rows, summary = grade_class(Path(args.submissions), out, sandbox, jobs=args.jobs, timeout=args.timeout,
                                    dask_address=args.dask, progress=not args.quiet, notebooks=args.notebook,
                                    gradebook=args.gradebook, salt=0 if args.public_scenarios else None)
    except SubmissionsError as exc:
        print(f"error: {terminal(str(exc))}", file=sys.stderr)
        return 2
    if summary.gradebook:
        print(terminal(summary.gradebook))
    for note in summary.notes():
        print(f"note: {terminal(note)}", file=sys.stderr)
    print(summary.line())
    print(f"wrote {out / 'grades.csv'}, {out / 'summary.csv'}, {out / 'feedback'}/ (index.csv names each file) and "
          f"the class report {out / 'report.html'}")
    return 1 if summary.problems else 0


def _class_report(args) -> int:
    from .grader.class_report import report_from_out
    from .grader.escape import terminal
    from .grader.outputs import RESULTS

    out = Path(args.out)
    if not (out / RESULTS).is_file():
        print(f"error: {terminal(str(out))} holds no results.json: grade into it first (python -m autograder grade "
              "SUBMISSIONS --out OUT)", file=sys.stderr)
        return 2
    return _report(report_from_out(out, Path(args.submissions) if args.submissions else None),
                   f"wrote {out / 'report.html'} and {out / 'report'}/")


def _report(problems: list[str], ok: str) -> int:
    for p in problems:
        print(p, file=sys.stderr)
    print(ok if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def _observe_public() -> dict[str, dict]:
    """Every reference solution observed on the public scenarios, in a worker like class grading's (the
    solutions are trusted code, so without isolation)."""
    from .authoring.course import load_course
    from .grader.references import reference_observations
    from .grader.sandbox.launch import make_sandbox

    course = load_course()
    return reference_observations(course, course.exercises, make_sandbox(enabled=False), salt=0,
                                  jobs=os.cpu_count() or 1)


def _generate(args) -> int:
    from .authoring.generate import check_generated, generate
    from .authoring.readme import stale_readme, write_readme
    from .authoring.reference_files import stale_references, write_references

    if args.check:
        return _report(check_generated() + stale_references() + stale_readme(),
                       "student notebooks, reference observations and the README's lessons table match solutions/")
    for line in generate() + write_references(_observe_public()) + write_readme():
        print(line)
    return 0


def _references(args) -> int:
    from .authoring.reference_files import stale_references, write_references

    if args.check:
        return _report(stale_references(), "reference observations match solutions/")
    for line in write_references(_observe_public()):
        print(line)
    return 0


def _student_kit(args) -> int:
    from .authoring.studentkit import build_student_kit

    for line in build_student_kit(Path(args.out)):
        print(line)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description="Training at Scale: instructor tools")
    sub = parser.add_subparsers(dest="command", required=True)

    grade = sub.add_parser("grade", help="grade a folder or LMS zip of submissions")
    grade.add_argument("submissions", help="folder of <student>/<notebook>.ipynb, or an LMS zip download")
    grade.add_argument("--out", required=True, help="folder for grades.csv, summary.csv and feedback/")
    grade.add_argument("--jobs", type=int, default=os.cpu_count(), help="students graded at once (default: cores)")
    grade.add_argument("--timeout", type=float, help="seconds per exercise (default: each exercise's own)")
    grade.add_argument("--memory-gb", type=float, default=4.0, help="address-space limit per process (default 4)")
    grade.add_argument("--total-memory-gb", type=float,
                       help="memory limit for all of one student's processes and files, where cgroups allow "
                            "(default: the larger of --memory-gb and 4)")
    grade.add_argument("--notebook", action="append", help="grade only this notebook (repeatable)")
    grade.add_argument("--dask", metavar="ADDRESS", help="grade on a Dask cluster (scheduler address, or 'local')")
    grade.add_argument("--gradebook", action="store_true", help="also record scores in the nbgrader gradebook")
    grade.add_argument("--fresh", action="store_true", help="ignore results saved by an earlier run")
    grade.add_argument("--public-scenarios", action="store_true",
                       help="grade on the public scenarios the students' self-checks use (default: held-out ones, "
                            "so that replaying the reference results shipped in the student kit earns nothing)")
    grade.add_argument("--cpu-only", action="store_true",
                       help="grade on the CPU only, even where a GPU is visible (CUDA scenarios are then not graded)")
    grade.add_argument("--no-sandbox", action="store_true", help="run submitted code without isolation (debugging)")
    grade.add_argument("--quiet", action="store_true", help="no progress bar")
    grade.set_defaults(run=_grade)

    report = sub.add_parser("report", help="write the class report (report.html, report/*.csv) from a graded OUT folder")
    report.add_argument("out", help="the --out folder of an earlier `grade` run")
    report.add_argument("--submissions", help="the submissions again, to recompute similar submissions "
                                              "(default: OUT/similar.csv of the grading run)")
    report.set_defaults(run=_class_report)

    gen = sub.add_parser("generate", help="generate notebooks/ (student versions) from solutions/")
    gen.add_argument("--check", action="store_true", help="only check that notebooks/ is up to date")
    gen.set_defaults(run=_generate)

    refs = sub.add_parser("references", help="record the reference observations that ship to students")
    refs.add_argument("--check", action="store_true", help="only check that the shipped file matches solutions/")
    refs.set_defaults(run=_references)

    kit = sub.add_parser("student-kit", help="build the student kit: notebooks, helpers, self-checks, no solutions")
    kit.add_argument("--out", default="dist/student-kit", help="folder to build it in (default: dist/student-kit)")
    kit.set_defaults(run=_student_kit)

    args = parser.parse_args(argv)
    return args.run(args)
