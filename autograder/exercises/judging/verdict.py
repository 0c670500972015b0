"""Scores and plain-text reports of check results (shared by notebook cells and class grading).

The report leads with the diagnosed cause (``diagnosis.py``, rendered by ``feedback.py``) when one is given.
"""
from ..exercise import CheckResult
from . import feedback
from .diagnosis import Diagnosis


def total(results: list[CheckResult]) -> float:
    return round(sum(r.score for r in results), 4)


def format_report(exercise: str, results: list[CheckResult], diagnosis: Diagnosis | None = None) -> str:
    max_score = sum(r.points for r in results)
    return feedback.text(exercise, f"{total(results):g} / {max_score:g}", results, diagnosis)


def feedback_sentence(results: list[CheckResult], diagnosis: Diagnosis | None = None) -> str:
    """One cell of grades.csv: the cause and its fix first, then every failed check it does not explain."""
    return feedback.sentence(results, diagnosis)


def score_result(score: float, max_score: float) -> dict | None:
    """A test cell's result (``Out[]``) as nbgrader needs it: None at full marks (nbgrader gives a test cell that
    neither failed nor returned a value all its points), else the score as text/plain, which nbgrader reads as the
    partial credit, and, for the reader, what that number is."""
    if score >= max_score:
        return None
    return {"text/plain": repr(float(score)),
            "text/html": f"<b>Score: {score:g} / {max_score:g}</b> (nbgrader reads this cell's score from this result)"}
