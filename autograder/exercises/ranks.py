"""The observing side of every rank exercise: one scenario on forked local ranks (gloo), the student's code
called inside them, failures turned into one sentence.

``observe_on_ranks(salt, cases, rank_fn, fn)`` observes every scenario on ``case["world_size"]`` ranks;
``rank_fn(rank, world_size, fn, case)`` is the exercise's code for one rank and calls the student's code through
``student_call``. Every rank's record says ``"forbidden": True`` when it found the student using what the exercise
forbids (torch's own implementation of it), else ``False``; ``reading.rank_results`` turns that into the
exercise's sentence. The
scenario's record is ``{"ranks": [what each rank returned]}`` or ``{"error": ...}``: ``DEADLOCK`` when the ranks
waited for each other until the launch timed out (a collective only some ranks called), else what the student's
code raised. No process is left behind either way (``coursekit.dist.launch``).
"""
from .observing import describe_exception, observation
from .reading import DEADLOCK

LAUNCH_TIMEOUT_S = 8.0  # one scenario's ranks; a correct run takes well under a second
_STUDENT_RAISED = "the student's code raised: "


class StudentCodeFailed(RuntimeError):
    """The student's code raised inside a rank; the message carries its words after a mark run_on_ranks finds."""


def student_call(fn, *args, **kwargs):
    """Call the student's code inside a rank, so that what it raises reaches the feedback in its own words."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # keep only the student's words; the rank's traceback is noise here
        raise StudentCodeFailed(_STUDENT_RAISED + describe_exception(exc).replace("\n", " ")) from None


def run_on_ranks(rank_fn, world_size: int, *args, timeout: float = LAUNCH_TIMEOUT_S) -> dict:
    """One scenario on ``world_size`` forked ranks: ``{"ranks": [...]}`` or ``{"error": ...}``."""
    from coursekit.dist import RankFailed, RanksTimedOut, launch  # forks ranks: only the observing side needs it

    try:
        ranks = launch(rank_fn, world_size, *args, backend="gloo", timeout=timeout)
    except RanksTimedOut:
        return {"error": DEADLOCK}
    except RankFailed as exc:
        text = str(exc)
        if _STUDENT_RAISED not in text:  # the grader's own code in the rank failed: the traceback's last line
            return {"error": text.strip().splitlines()[-1][:300]}
        raised = " ".join(text.split(_STUDENT_RAISED, 1)[1].splitlines()[0].split())[:200]
        if any(s in raised for s in ("Timed out", "timed out", "closed by peer", "Connection reset", "Broken pipe")):
            return {"error": DEADLOCK}  # a collective timed out, or its peer rank was stopped
        return {"error": raised}
    return {"ranks": ranks}


def observe_on_ranks(salt: int, cases: dict[str, dict], rank_fn, fn, *, timeout: float = LAUNCH_TIMEOUT_S) -> dict:
    """Every scenario observed on its own ranks (``case["world_size"]`` of them)."""
    return observation(salt, cases, lambda case: run_on_ranks(rank_fn, case["world_size"], fn, case, timeout=timeout))
