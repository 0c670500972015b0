"""The self-check: what a notebook's test cell runs, ``check("train_with_accumulation", train_with_accumulation)``.

Runs in the student's kernel (nbgrader Validate and ``nbgrader autograde``), so it is only as trustworthy as that
kernel; class grading (``python -m autograder grade``) moves the verdict out of the student's process. Both use the
same observations and the same checks.

The reference: in the student kit (and in a released notebook) it is the observation shipped in
``autograder/references/`` (``recorded.py``), and the report says when this machine's setting differs from the one
it was recorded in; in the instructor's checkout the caller passes ``live_reference``, which observes the reference
solution itself.

Nothing reaches stderr: nbgrader scores a test cell that wrote to stderr as 0 (``capture.py``); only under nbgrader's
Validate does a report short of full marks go there, so that Validate shows it (``score.py``).
"""
import os
from collections.abc import Callable

from ..exercises import get_exercise
from ..exercises.beside.observing import observe
from ..exercises.judging.diagnosis import diagnose
from ..exercises.judging.verdict import format_report, total
from .capture import captured_output
from .recorded import ReferenceUnavailable, load_recorded, on_this_machine, setting_notes
from .score import report_stream, shown_score


def check(exercise: str, fn, *, live_reference: Callable[[str], dict] | None = None) -> float:
    """Grade ``fn`` against the reference; print the report and return the score (nbgrader partial credit)."""
    import torch

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    ex = get_exercise(exercise)
    recorded = None
    if live_reference is None:
        try:
            recorded = load_recorded(exercise)
        except ReferenceUnavailable as problem:
            print(f"{exercise}: not checked. {problem}", file=report_stream(True))
            return shown_score(0.0, ex.max_score)
    with captured_output() as output:
        reference = recorded.observation if recorded else live_reference(exercise)  # before the student's code runs
        student = observe(ex, fn)
    if recorded:
        reference = on_this_machine(recorded, student)
    results = ex.grade(student, reference)
    out = report_stream(total(results) < ex.max_score)
    print(format_report(exercise, results, diagnose(ex, student, reference, results)), file=out)
    for note in setting_notes(recorded, student, torch.__version__) if recorded else ():
        print(note, file=out)
    lines = [line for line in output[0].splitlines() if line.strip()]
    if lines:
        print(f"\n(While being checked, the code printed {len(lines)} line(s); the first ones:)", file=out)
        print("\n".join("    " + line[:200] for line in lines[:8]), file=out)
    return shown_score(total(results), ex.max_score)
