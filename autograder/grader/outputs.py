"""The OUT folder of a grading run, in one place: where each file goes and how every one is written.

Every file is written atomically (a temporary file in the same folder, then a rename), so an interrupted run never
leaves half a file, and every CSV the same way (each cell through ``escape.csv_cell``). The layout:

* ``grades.csv``, ``summary.csv``, ``feedback/`` (one Markdown and one HTML file per student, ``index.csv``): report.py;
* ``run.json`` (the run's summary) and ``.state/`` (each finished student's rows, for a resumed run): batch.py;
* ``results.json`` (every row), ``similar.csv``, ``report.html`` and ``report/*.csv``: class_report.py, which
  ``python -m autograder report OUT`` rebuilds from ``results.json``, ``run.json`` and ``similar.csv``.
"""
import csv
import hashlib
import io
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from .escape import csv_cell
from .rows import Row

GRADES, SUMMARY, FEEDBACK = "grades.csv", "summary.csv", "feedback"
RUN, RESULTS, STATE = "run.json", "results.json", ".state"
SIMILAR, REPORT_HTML, REPORT_TABLES = "similar.csv", "report.html", "report"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.")
    with os.fdopen(fd, "w", newline="", encoding="utf-8", errors="replace") as f:
        f.write(text)
    os.replace(tmp, path)


def csv_text(header: list[str], rows: list[list]) -> str:
    """A CSV file's text; every cell escaped (a student's string never becomes a spreadsheet formula)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([csv_cell(h) for h in header])
    writer.writerows([[csv_cell(cell) for cell in row] for row in rows])
    return buffer.getvalue()


def save_rows(out: Path, rows: list[Row], exercises: list[str]) -> None:
    write_atomic(out / RESULTS, json.dumps({"exercises": exercises, "rows": [asdict(r) for r in rows]}) + "\n")


def load_rows(out: Path) -> tuple[list[Row], list[str]]:
    data = json.loads((out / RESULTS).read_text())
    return [Row(**r) for r in data["rows"]], list(data["exercises"])


def save_run(out: Path, summary: dict) -> None:
    write_atomic(out / RUN, json.dumps(summary, indent=2) + "\n")


def load_run(out: Path) -> dict:
    """The run's summary, or an empty one when the run did not get that far."""
    try:
        return json.loads((out / RUN).read_text())
    except (OSError, ValueError):
        return {}


def state_file(out: Path, student: str) -> Path:
    return out / STATE / (hashlib.sha256(student.encode("utf-8", "surrogateescape")).hexdigest()[:24] + ".json")


def save_state(out: Path, student: str, saved: dict, rows: list[Row]) -> None:
    """One finished student's rows, with what they were graded under (``saved``: batch.py says what)."""
    write_atomic(state_file(out, student), json.dumps({"student": student, **saved, "rows": [asdict(r) for r in rows]}))


def load_state(out: Path, student: str) -> tuple[dict, list[Row]] | None:
    """A student's saved rows and what they were graded under, or None when there are none that can be read."""
    try:
        saved = json.loads(state_file(out, student).read_text())
        return saved, [Row(**r) for r in saved["rows"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
