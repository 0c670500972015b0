"""What the notebooks' test cells call: ``check("train_with_accumulation", train_with_accumulation)``.

Runs in the student's kernel (nbgrader Validate and ``nbgrader autograde``), so it is only as
trustworthy as that kernel; class grading with ``python -m autograder grade`` moves the
verdict out of the student's process. Both use the same observations and the same checks.

The reference: on the instructor's machine (``solutions/`` present) it is observed live from the reference
solution; everywhere else (the student kit, a released notebook) it is the observation shipped in
``reference_observations.json`` (see ``observations.py``), and the report says when this machine's setting
differs from the one it was recorded in.

Nothing reaches stderr: nbgrader scores a test cell that wrote to stderr as 0, so the
student's prints and warnings (even C-level ones from forked ranks) are captured and
summarised on stdout.
"""
import contextlib
import io
import os
import sys
import tempfile
import warnings

import torch

from .exercises import get_exercise
from .observations import ReferenceUnavailable, load_recorded, on_this_machine, setting_notes
from .verdict import format_report, total

_live_reference_cache = {}


@contextlib.contextmanager
def captured_output():
    """Capture Python- and C-level stdout/stderr and warnings; yields a list that receives the text."""
    box = []
    sys.stdout.flush(), sys.stderr.flush()
    with tempfile.TemporaryFile(mode="w+b") as sink, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        saved = os.dup(1), os.dup(2)
        py_out = io.StringIO()
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_out):
                yield box
        finally:
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
            sink.seek(0)
            text = py_out.getvalue() + sink.read().decode(errors="replace")
            text += "".join(f"{w.category.__name__}: {w.message}\n" for w in caught)
            box.append(text)


def solutions_here() -> bool:
    """True on the instructor's machine: the reference solutions themselves can be run."""
    try:
        from .course import course_root
    except ImportError:  # the student kit ships without the course reader
        return False
    try:
        course_root()
    except FileNotFoundError:
        return False
    return True


def live_reference(exercise: str) -> dict:
    """Observe the reference solution in this kernel (instructor only), once per exercise."""
    if exercise not in _live_reference_cache:
        from .reference import reference_function

        ex = get_exercise(exercise)
        _live_reference_cache[exercise] = ex.observe_as_reference(reference_function(exercise))
    return _live_reference_cache[exercise]


def check(exercise: str, fn) -> float:
    """Grade ``fn`` against the reference; print the report and return the score (nbgrader partial credit)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    ex = get_exercise(exercise)
    recorded = None
    if not solutions_here():
        try:
            recorded = load_recorded(exercise)
        except ReferenceUnavailable as problem:
            print(f"{exercise}: not checked. {problem}")
            return 0.0
    with captured_output() as output:
        reference = recorded.observation if recorded else live_reference(exercise)  # before the student's code runs
        student = ex.observe(fn)
    if recorded:
        reference = on_this_machine(recorded, student)
    results = ex.grade(student, reference)
    print(format_report(exercise, results))
    for note in setting_notes(recorded, student, torch.__version__) if recorded else ():
        print(note)
    lines = [line for line in output[0].splitlines() if line.strip()]
    if lines:
        print(f"\n(While being checked, the code printed {len(lines)} line(s); the first ones:)")
        print("\n".join("    " + line[:200] for line in lines[:8]))
    return total(results)
