"""Submissions made the way students make them: the released notebook with exercise cells filled in.

For benchmarks, dry runs of a grading setup and the tests. Instructor-side: ``reference_source`` reads the
solutions, so nothing here is part of the student kit (no test cell imports it).
"""
import json
from pathlib import Path

from .course import course_root


def released_notebook(name: str) -> dict:
    """The student version of a notebook, as released (from notebooks/)."""
    (path,) = [p for p in (course_root() / "notebooks").rglob(name) if ".ipynb_checkpoints" not in p.parts]
    return json.loads(path.read_text())


def reference_source(exercise: str) -> str:
    """The reference solution's cell source of ``exercise``."""
    from .course import load_course

    return load_course().spec_for_exercise(exercise).reference_code[exercise]


def filled(notebook: str, answers: dict[str, str]) -> dict:
    """The released notebook with each exercise cell (by grade_id) replaced by the given source."""
    nb = released_notebook(notebook)
    for cell in nb["cells"]:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell["source"] = answers[grade_id]
    return nb


def write(folder: Path, student: str, notebook: str, content: dict | bytes | str) -> Path:
    """``folder/student/notebook`` with ``content`` (a notebook dict, or raw bytes/text as uploaded)."""
    path = folder / student / notebook
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, dict):
        content = json.dumps(content, indent=1)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path
