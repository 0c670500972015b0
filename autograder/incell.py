"""What the notebooks' test cells call: ``check("train_with_accumulation", train_with_accumulation)``.

Runs in the student's kernel (nbgrader Validate and ``nbgrader autograde``), so it is only as
trustworthy as that kernel; class grading with ``python -m autograder grade`` moves the
verdict out of the student's process. Both use the same observations and the same checks.

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

from .exercises import get_exercise
from .reference import reference_function
from .verdict import format_report, total

_reference_cache = {}


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


def check(exercise: str, fn) -> float:
    """Grade ``fn`` against the reference; print the report and return the score (nbgrader partial credit)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    ex = get_exercise(exercise)
    with captured_output() as output:
        if exercise not in _reference_cache:  # first, before the student's code can change global state
            _reference_cache[exercise] = ex.observe_as_reference(reference_function(exercise))
        student = ex.observe(fn)
    results = ex.grade(student, _reference_cache[exercise])
    print(format_report(exercise, results))
    lines = [line for line in output[0].splitlines() if line.strip()]
    if lines:
        print(f"\n(While being checked, the code printed {len(lines)} line(s); the first ones:)")
        print("\n".join("    " + line[:200] for line in lines[:8]))
    return total(results)
