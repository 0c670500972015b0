"""What a test cell shows after its report, and where the report goes.

nbgrader reads a test cell's partial credit only from its result (``execute_result``, ``utils.determine_grade``),
so a score short of full marks must be the cell's ``Out[]``: it is shown as what it is ("Score: 7 / 11"). A cell
that neither fails nor returns a value gets all its points, so at full marks there is no ``Out[]`` at all.
"""
import os
import sys
import textwrap

from ..exercises.judging.verdict import score_result


class PartialScore(float):
    """A float (``check()``'s return value) that Jupyter shows as the score it is."""

    def __new__(cls, score: float, max_score: float):
        obj = super().__new__(cls, score)
        obj.max_score = max_score
        return obj

    def _repr_mimebundle_(self, include=None, exclude=None):
        return score_result(float(self), self.max_score)


class FullScore(float):
    """Full marks: a float that Jupyter does not show (nbgrader needs no result for them)."""

    def _ipython_display_(self):
        pass


def shown_score(score: float, max_score: float) -> float:
    return FullScore(score) if score_result(score, max_score) is None else PartialScore(score, max_score)


def report_stream(short_of_full: bool):
    """Where the report goes: stdout, except under nbgrader's Validate (``NBGRADER_EXECUTION=validate``) when the
    score is short of full marks. Validate prints a failed cell's stderr as its error; without it, it says "Partial
    credit; passed some but not all of the tests", even of a blank notebook. Validate's outputs are never shown in
    the notebook, and such a cell fails Validate either way; Run All and ``nbgrader autograde`` keep stdout."""
    if short_of_full and os.environ.get("NBGRADER_EXECUTION") == "validate":
        return _Wrapped()
    return sys.stdout


class _Wrapped:
    """stderr, every line wrapped to fit `nbgrader validate`'s width (90, indented by 4: it cuts longer lines)."""

    WIDTH = 83

    def write(self, text: str) -> None:
        lines = []
        for line in text.split("\n"):
            indent = line[: len(line) - len(line.lstrip())]
            lines.append(textwrap.fill(line, self.WIDTH, subsequent_indent=indent + "  ", break_long_words=False,
                                       break_on_hyphens=False) if len(line) > self.WIDTH else line)
        sys.stderr.write("\n".join(lines))

    def flush(self) -> None:
        sys.stderr.flush()
