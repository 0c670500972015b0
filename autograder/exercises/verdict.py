"""Scores and plain-text reports of check results (shared by notebook cells and class grading)."""
from .protocol import CheckResult


def total(results: list[CheckResult]) -> float:
    return round(sum(r.score for r in results), 4)


def format_report(exercise: str, results: list[CheckResult]) -> str:
    max_score = sum(r.points for r in results)
    lines = [f"{exercise}: {total(results):g} / {max_score:g} points"]
    shared = feedback_sentence(results) if all(not r.passed for r in results) and len(results) > 1 else ""
    if shared and " | " not in shared:  # every check failed for one reason: say it once
        return "\n".join(lines + [f"  {shared}"])
    for r in results:
        mark = "PASS" if r.passed else "FAIL"
        lines.append(f"  [{mark}] {r.title} ({r.score:g}/{r.points:g})")
        if r.feedback:
            lines.append(f"         {r.feedback}")
    return "\n".join(lines)


def feedback_sentence(results: list[CheckResult]) -> str:
    """One cell of grades.csv: every failed check's sentence, or a short all-clear."""
    failed = [r for r in results if not r.passed]
    if not failed:
        return "All checks passed."
    if len(failed) > 1 and len({r.feedback for r in failed}) == 1:  # one cause, e.g. the function is not written yet
        return failed[0].feedback
    return " | ".join(f"{r.title}: {r.feedback}" for r in failed)


def score_result(score: float, max_score: float) -> dict | None:
    """A test cell's result (``Out[]``) as nbgrader needs it: None at full marks (nbgrader gives a test cell that
    neither failed nor returned a value all its points), else the score as text/plain, which nbgrader reads as the
    partial credit, and, for the reader, what that number is."""
    if score >= max_score:
        return None
    return {"text/plain": repr(float(score)),
            "text/html": f"<b>Score: {score:g} / {max_score:g}</b> (nbgrader reads this cell's score from this result)"}
