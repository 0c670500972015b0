"""The course as the grader sees it, read from the instructor notebooks in ``solutions/``.

``solutions/<assignment>/<notebook>.ipynb`` is the single source of truth: which notebooks
exist, which graded exercises each holds (solution cells whose nbgrader ``grade_id`` is a
registered exercise), the reference code of each exercise, and the notebook's setup cells
(code cells tagged ``setup``) that the grader runs before a student's cell.
"""
import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from ..exercises import all_exercises
from ..exercises.beside.define import define_function

SETUP_TAG = "setup"


@dataclass
class NotebookSpec:
    assignment: str                 # nbgrader assignment id, e.g. "lesson1"
    name: str                       # released file name, e.g. "01_gradient_accumulation.ipynb"
    source: Path                    # the instructor notebook
    setup_code: list[str] = field(default_factory=list)
    reference_code: dict[str, str] = field(default_factory=dict)  # exercise -> solution cell source
    test_points: dict[str, float] = field(default_factory=dict)   # exercise -> points of its test cell

    @property
    def exercises(self) -> list[str]:
        return list(self.reference_code)


def course_root() -> Path:
    """The instructor's checkout: ``$COURSE_ROOT``, or the folder that holds the ``autograder`` package."""
    root = Path(os.environ.get("COURSE_ROOT", Path(__file__).resolve().parents[2]))
    if not (root / "solutions").is_dir():
        raise FileNotFoundError(f"no solutions/ folder under {root}: set COURSE_ROOT to the course repository")
    return root


def classroom_dir() -> Path:
    """nbgrader's course directory: its config (committed); the gradebook, exchange and submissions it collects."""
    return course_root() / "classroom"


def nbgrader_config():
    """The course's nbgrader configuration (``classroom/nbgrader_config.py``), as nbgrader's own apps read it."""
    from traitlets.config import PyFileConfigLoader

    return PyFileConfigLoader("nbgrader_config.py", path=str(classroom_dir())).load_config()


def cell_source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def read_spec(path: Path) -> NotebookSpec:
    nb = json.loads(path.read_text())
    spec = NotebookSpec(assignment=path.parent.name, name=path.name, source=path)
    known = all_exercises()
    for cell in nb["cells"]:
        meta = cell.get("metadata", {})
        grader = meta.get("nbgrader", {})
        grade_id = grader.get("grade_id", "")
        if cell["cell_type"] == "code" and SETUP_TAG in meta.get("tags", []):
            spec.setup_code.append(cell_source(cell))
        if grader.get("solution") and grade_id in known:
            spec.reference_code[grade_id] = cell_source(cell)
        if grader.get("grade") and grade_id.startswith("test_") and grade_id[5:] in known:
            spec.test_points[grade_id[5:]] = float(grader.get("points", 0))
    return spec


@dataclass
class Course:
    root: Path
    notebooks: dict[str, NotebookSpec]  # by released file name

    def spec_for_exercise(self, exercise: str) -> NotebookSpec:
        for spec in self.notebooks.values():
            if exercise in spec.reference_code:
                return spec
        raise KeyError(f"no notebook in solutions/ holds the exercise {exercise!r}")

    @property
    def exercises(self) -> list[str]:
        return [e for spec in self.notebooks.values() for e in spec.exercises]

    def reference_cells(self, exercise: str) -> list[tuple[str, str]]:
        """The cells that define the reference solution, as (name, code): the notebook's setup cells, then its own."""
        spec = self.spec_for_exercise(exercise)
        return [(f"setup cell of {spec.name}", code) for code in spec.setup_code] + [
            (f"reference cell {exercise}", spec.reference_code[exercise])]


@cache
def load_course(root: Path | None = None) -> Course:
    root = Path(root) if root else course_root()
    paths = sorted(p for p in (root / "solutions").glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    return Course(root, {p.name: read_spec(p) for p in paths})


# ---- the reference solutions (trusted code: the instructor's own cells) ----------------------------

@cache
def reference_function(exercise: str):
    """The reference solution of the course in this checkout, defined in this process."""
    return define_function(load_course().reference_cells(exercise), exercise)


_live = {}


def live_reference(exercise: str) -> dict:
    """The reference solution observed in this process (the instructor's kernel), once per exercise."""
    if exercise not in _live:
        from ..exercises import get_exercise
        from ..exercises.beside.observing import observe

        _live[exercise] = observe(get_exercise(exercise), reference_function(exercise), as_reference=True)
    return _live[exercise]
