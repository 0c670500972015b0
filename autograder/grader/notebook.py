"""The one boundary where a submitted notebook's bytes become typed data (parse, don't validate).

``parse_notebook(bytes) -> Notebook`` accepts exactly the shapes JupyterLab writes for the fields the grader
uses (cell kind, source, nbgrader metadata, cell id) and turns everything else into a ``NotebookProblem``
whose message tells the student what is wrong. Fields the grader never uses (outputs, other metadata) are
not read at all. Downstream code (matching, grading, gradebook, feedback) only sees ``Notebook`` and
``Cell``: it never touches raw JSON, so no shape a student can produce reaches it.
"""
import json
import re
from dataclasses import dataclass

from ..authoring.course import NotebookSpec

MAX_NOTEBOOK_BYTES = 20 << 20
MAX_CELLS = 5000
MAX_SOURCE_CHARS = 2_000_000   # one cell
MAX_TOTAL_SOURCE = 4_000_000   # all cells: what the grader keeps of a notebook (the lessons hold about 150,000)
MAX_ID_CHARS = 200             # grade_id, cell id
KINDS = ("code", "markdown", "raw")
# C0 controls other than tab, newline, carriage return and form feed, DEL, and C1 controls: no editor puts
# them into source text, and they can carry terminal escape sequences into reports.
CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")
CELL_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHECKSUM = re.compile(r"^[0-9a-f]{1,128}$")


class NotebookProblem(Exception):
    """The whole notebook (or one exercise of it) cannot be graded; the message says why, for the student."""


@dataclass(frozen=True)
class Cell:
    kind: str                  # "code", "markdown" or "raw"
    source: str
    grade_id: str | None = None
    solution: bool = False     # nbgrader flags
    grade: bool = False
    locked: bool = False
    task: bool = False
    points: float = 0.0
    checksum: str | None = None
    cell_id: str | None = None


@dataclass(frozen=True)
class Notebook:
    cells: tuple[Cell, ...]
    nbformat_minor: int


def parse_notebook(data: bytes) -> Notebook:
    if not isinstance(data, bytes) or not data.strip():
        raise NotebookProblem("The notebook file is empty.")
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise NotebookProblem(f"The notebook is larger than {MAX_NOTEBOOK_BYTES >> 20} MB; clear its outputs and submit again.")
    try:
        raw = json.loads(data)
    except RecursionError:
        raise NotebookProblem("The file is not a notebook: its JSON is nested far too deeply.") from None
    except ValueError as exc:
        where = f" (line {exc.lineno})" if hasattr(exc, "lineno") else ""
        raise NotebookProblem(f"The file is not valid notebook JSON{where}: it was damaged or is not a notebook. "
                              "Download it again from JupyterLab (File → Download) and resubmit.") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        raise NotebookProblem("The file is JSON but not a Jupyter notebook (no list of cells).")
    if raw.get("nbformat") != 4:
        version = raw.get("nbformat")
        shown = repr(version) if isinstance(version, int | float | None) else f"of type {type(version).__name__}"
        raise NotebookProblem(f"The notebook uses nbformat {shown}; save it with JupyterLab (nbformat 4) and resubmit.")
    minor = raw.get("nbformat_minor", 0)
    if len(raw["cells"]) > MAX_CELLS:
        raise NotebookProblem(f"The notebook has more than {MAX_CELLS} cells.")
    cells = tuple(_cell(c, i + 1) for i, c in enumerate(raw["cells"]))
    if sum(len(c.source) for c in cells) > MAX_TOTAL_SOURCE:
        raise NotebookProblem(f"The notebook holds more than {MAX_TOTAL_SOURCE:,} characters of cell text; submit "
                              "the lesson notebook itself.")
    return Notebook(cells, minor if isinstance(minor, int) and not isinstance(minor, bool) and 0 <= minor < 100 else 0)


def _damaged(number: int, what: str) -> NotebookProblem:
    return NotebookProblem(f"Cell {number} of the notebook is damaged: {what}. The file was edited outside "
                           "JupyterLab or corrupted; copy your code into a fresh copy of the notebook and resubmit.")


def _text(value, number: int, field: str, limit: int) -> str:
    if isinstance(value, list):
        if not all(isinstance(part, str) for part in value):
            raise _damaged(number, f"its {field} is a list holding something other than text")
        value = "".join(value)
    if not isinstance(value, str):
        raise _damaged(number, f"its {field} is {type(value).__name__}, not text")
    if len(value) > limit:
        raise _damaged(number, f"its {field} is longer than {limit:,} characters")
    if CONTROL.search(value):
        raise _damaged(number, f"its {field} holds control characters (code {ord(CONTROL.search(value)[0]):#04x})")
    return value


def _flag(grader: dict, key: str, number: int) -> bool:
    value = grader.get(key, False)
    if not isinstance(value, bool):
        raise _damaged(number, f"its nbgrader `{key}` flag is {type(value).__name__}, not true/false")
    return value


def _cell(raw, number: int) -> Cell:
    if not isinstance(raw, dict):
        raise _damaged(number, f"it is {type(raw).__name__}, not an object")
    kind = raw.get("cell_type")
    if kind not in KINDS:
        raise _damaged(number, "its cell_type is not code, markdown or raw")
    source = _text(raw.get("source", ""), number, "source", MAX_SOURCE_CHARS)
    metadata = raw.get("metadata", {})
    if not isinstance(metadata, dict):
        raise _damaged(number, f"its metadata is {type(metadata).__name__}, not an object")
    grader = metadata.get("nbgrader")
    cell_id = raw.get("id")
    cell_id = cell_id if isinstance(cell_id, str) and CELL_ID.match(cell_id) else None
    if grader is None:
        return Cell(kind, source, cell_id=cell_id)
    if not isinstance(grader, dict):
        raise _damaged(number, f"its nbgrader metadata is {type(grader).__name__}, not an object")
    grade_id = grader.get("grade_id")
    if grade_id is not None and not isinstance(grade_id, str):  # a list would pass the text check when joined
        raise _damaged(number, f"its nbgrader grade_id is {type(grade_id).__name__}, not text")
    grade_id = _text(grade_id or "", number, "nbgrader grade_id", MAX_ID_CHARS)
    points = grader.get("points", 0)
    if isinstance(points, bool) or not isinstance(points, int | float) or not 0 <= points < 1e6:
        raise _damaged(number, "its nbgrader points are not a number between 0 and a million")
    checksum = grader.get("checksum")
    return Cell(kind, source, grade_id or None, _flag(grader, "solution", number), _flag(grader, "grade", number),
                _flag(grader, "locked", number), _flag(grader, "task", number), float(points),
                checksum if isinstance(checksum, str) and CHECKSUM.match(checksum) else None, cell_id)


def graded_cell_ids(nb: Notebook) -> set[str]:
    return {c.grade_id for c in nb.cells if c.grade_id}


def exercise_cells(nb: Notebook, spec: NotebookSpec) -> dict[str, str | NotebookProblem]:
    """For each exercise of the notebook: the student's cell source, or the problem that prevents grading."""
    found: dict[str, list[str]] = {name: [] for name in spec.exercises}
    for cell in nb.cells:
        if cell.kind == "code" and cell.grade_id in found:
            found[cell.grade_id].append(cell.source)
    cells = {}
    for name, sources in found.items():
        if not sources:
            cells[name] = NotebookProblem(f"The graded cell `{name}` is missing from the notebook (it was deleted, "
                                          "or pasted into a new cell without its metadata). Copy your function into "
                                          "the exercise cell of a fresh copy of the notebook.")
        elif len(sources) > 1:
            cells[name] = NotebookProblem(f"The graded cell `{name}` appears {len(sources)} times (a duplicated "
                                          "cell). Keep exactly one copy of it and resubmit.")
        else:
            cells[name] = sources[0]
    return cells
