"""A grading row: one student's result for one exercise, as every output (CSV, feedback, report, gradebook) reads it."""
import re
from dataclasses import dataclass, field

from ..exercises import get_exercise
from .messages import REASON_CHARS, clean_text
from .submissions import Submission

ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


@dataclass
class Row:
    student: str
    notebook: str
    exercise: str
    score: float
    max_score: float
    feedback: str
    checks: list[dict] = field(default_factory=list)   # per check: title, points, score, feedback
    output: str = ""                                   # what the student's code printed (feedback files)
    graded: bool = True                                # False: the code could not be run (reason in feedback)
    name: str = ""                                     # the student's readable name (from the LMS file names)
    review: list[str] = field(default_factory=list)    # what in the cell an instructor may want to read (audit.py)
    cause: str = ""                                    # the diagnosed mistake's catalogue id(s) (diagnosis.py)
    diagnosis: dict = field(default_factory=dict)      # the whole diagnosis, for the feedback files and notebooks

    CSV_FIELDS = ("student", "notebook", "exercise", "score", "max_score", "feedback", "name", "cause")


def clean(text: str) -> str:
    """Same input, same file: drop memory addresses that differ from run to run."""
    return ADDRESS.sub("0x…", text)


def ungraded(submission: Submission, notebook: str, exercise: str, reason: str) -> Row:
    return Row(submission.student, notebook, exercise, 0.0, get_exercise(exercise).max_score,
               clean(clean_text(reason, 2 * REASON_CHARS)), graded=False, name=submission.name)
