"""Cells stay short enough to read at a glance: at most 40 lines each.

Every cell a student receives (notebooks/) and every instructor cell except the exercises' reference solutions,
whose released form (the scaffold) is what students read and is held to the limit here too.
"""
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIMIT = 40
NOTEBOOKS = sorted((REPO / "notebooks").rglob("*.ipynb")) + sorted((REPO / "solutions").rglob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.parent.name}/{p.stem}" if p.parent.name.startswith("lesson")
                                                 else f"{p.parent.name}/{p.stem}" for p in NOTEBOOKS])
def test_cells_are_at_most_40_lines(path):
    long = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution") and "solutions" in path.parts:
            continue  # a reference solution: its scaffold, in notebooks/, is checked instead
        lines = len("".join(cell["source"]).splitlines())
        if lines > LIMIT:
            long.append(f"cell {i}: {lines} lines")
    assert not long, f"{path.relative_to(REPO)}: cells over {LIMIT} lines: {long}"
