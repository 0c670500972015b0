"""Capture everything a check prints, so that nothing reaches the notebook's stderr.

nbgrader scores a test cell that wrote to stderr as 0, so the student's prints and warnings (even C-level ones from
forked ranks) are captured here and summarised on stdout by the self-check.
"""
import contextlib
import io
import os
import sys
import tempfile
import warnings


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
