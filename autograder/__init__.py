"""The course's grader: shared checks for notebook test cells and isolated class grading.

``check(exercise, fn)`` is what the notebooks' test cells call; ``python -m autograder``
is the instructor's command line (generate student notebooks, grade a class).
"""


def check(exercise: str, fn) -> float:
    from .incell import check as _check  # imported lazily: the CLI must not pay for torch

    return _check(exercise, fn)


__all__ = ["check"]
