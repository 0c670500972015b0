"""The course's grader: the notebooks' self-checks and isolated class grading.

Four parts, dependencies pointing one way (``tests/project/test_layering.py`` holds them):

* ``exercises/``: what an exercise is, and one package per graded exercise; each one's ``observe.py`` runs next to the
  student's code, its ``checks.py`` is the verdict (plain Python, no torch). Ships to students.
* ``selfcheck/``: what a notebook's test cell runs in the student's kernel. Ships to students, with ``references/``
  (the reference observations the self-checks compare with).
* ``grader/``: the class grader (trusted): submissions, sandboxed workers (``grader/sandbox/``), verdicts, reports,
  the nbgrader gradebook. Instructor only.
* ``authoring/``: the instructor's tools: the course read from ``solutions/``, the student notebooks, the reference
  observations, the student kit. Instructor only.

``check(exercise, fn)`` is what the test cells call; ``python -m autograder`` is the instructor's command line.
"""
import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def instructor_checkout() -> bool:
    """True in the instructor's repository (``solutions/`` beside the package, or ``$COURSE_ROOT``), where the
    authoring tools exist too; False in the student kit, which ships without both."""
    root = Path(os.environ.get("COURSE_ROOT", PACKAGE.parent))
    return (root / "solutions").is_dir() and (PACKAGE / "authoring").is_dir()


def check(exercise: str, fn) -> float:
    from .selfcheck import check as self_check  # imported here: the CLI must not pay for torch

    live = None
    if instructor_checkout():
        from .authoring.course import live_reference

        live = live_reference
    return self_check(exercise, fn, live_reference=live)


__all__ = ["check"]
