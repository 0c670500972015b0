"""What torch.compile makes of a function: how many graphs, how many graph breaks, and why.

``torch._dynamo.explain`` traces a function the way ``torch.compile`` does, without compiling it, and lists where
the trace had to stop (a print, a branch on a tensor's value, a call Dynamo cannot follow). It lives in a private
module of torch, so the course calls it only here (tests/coursekit/test_lesson7_helpers.py).
"""
import contextlib
import io
import logging


def graph_breaks(fn, *args) -> dict:
    """{"graphs": n, "breaks": n, "reasons": [one line each]} for ``fn(*args)``; what ``fn`` prints is swallowed."""
    import torch._dynamo

    logging.disable(logging.WARNING)  # Dynamo logs each break as a warning (stderr); the result lists them
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            found = torch._dynamo.explain(fn)(*args)
    finally:
        logging.disable(logging.NOTSET)
    return {"graphs": found.graph_count, "breaks": found.graph_break_count,
            "reasons": [_one_line(str(getattr(r, "reason", r))) for r in found.break_reasons]}


def _one_line(reason: str) -> str:
    """Dynamo's explanation of a break when it gives one (newer torch), else the reason's first line."""
    lines = [line.strip() for line in reason.strip().splitlines()]
    explained = [line.removeprefix("Explanation:").strip() for line in lines if line.startswith("Explanation:")]
    return (explained or lines or ["?"])[0][:160]
