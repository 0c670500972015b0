"""Reading a submitted notebook defensively: every problem becomes a sentence, never a crash."""
import json

from .course import NotebookSpec, cell_source

MAX_NOTEBOOK_BYTES = 20 << 20


class NotebookProblem(Exception):
    """The whole notebook cannot be graded; the message says why, for the student."""


def parse_notebook(data: bytes) -> dict:
    if not data.strip():
        raise NotebookProblem("The notebook file is empty.")
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise NotebookProblem(f"The notebook is larger than {MAX_NOTEBOOK_BYTES >> 20} MB; clear its outputs and submit again.")
    try:
        nb = json.loads(data)
    except (ValueError, RecursionError) as exc:
        where = f" (line {exc.lineno})" if hasattr(exc, "lineno") else ""
        raise NotebookProblem(f"The file is not valid notebook JSON{where}: it was damaged or is not a notebook. "
                              "Download it again from JupyterLab (File → Download) and resubmit.") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookProblem("The file is JSON but not a Jupyter notebook (no list of cells).")
    if nb.get("nbformat") != 4:
        raise NotebookProblem(f"The notebook uses nbformat {nb.get('nbformat')!r}; save it with JupyterLab "
                              "(nbformat 4) and resubmit.")
    return nb


def graded_cell_ids(nb: dict) -> set[str]:
    ids = set()
    for cell in nb["cells"]:
        grader = cell.get("metadata", {}).get("nbgrader", {}) if isinstance(cell, dict) else {}
        if isinstance(grader, dict) and isinstance(grader.get("grade_id"), str):
            ids.add(grader["grade_id"])
    return ids


def exercise_cells(nb: dict, spec: NotebookSpec) -> dict[str, str | NotebookProblem]:
    """For each exercise of the notebook: the student's cell source, or the problem that prevents grading."""
    found: dict[str, list[str]] = {name: [] for name in spec.exercises}
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        grader = cell.get("metadata", {}).get("nbgrader", {})
        grade_id = grader.get("grade_id") if isinstance(grader, dict) else None
        if grade_id in found:
            found[grade_id].append(cell_source(cell))
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
