"""One source for lesson run times: coursekit/results/lesson_times.json, written by `python -m bench.lesson_times`.

The start page prints that file (coursekit.run_times.show_run_times) and the README's lesson table repeats it; this
test fails when the README says something else, or when a lesson has no recorded time. No timing is measured here.
"""
import json
import re
from pathlib import Path

from coursekit.run_times import format_seconds, load_run_times, show_run_times

REPO = Path(__file__).resolve().parent.parent
LESSONS = sorted(str(p.relative_to(REPO / "solutions")) for p in (REPO / "solutions").rglob("*.ipynb")
                 if ".ipynb_checkpoints" not in p.parts)


def readme_run_times() -> dict[str, str]:
    """notebook (relative to solutions/) -> the README table's run-time cell."""
    lines = (REPO / "README.md").read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| # | Notebook |"))
    rows = {}
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        notebook = re.sub(r"^notebooks/", "", cells[1].strip("`"))
        rows[notebook] = cells[-1]
    return rows


def test_every_lesson_has_a_recorded_run_time_with_provenance():
    entry = load_run_times()
    assert entry is not None, "coursekit/results/lesson_times.json is missing: run python -m bench.lesson_times"
    assert all(isinstance(entry.get(k), str) and entry[k] for k in ("device", "torch", "date", "conditions"))
    assert sorted(entry["seconds"]) == LESSONS, "record the run time of every notebook in solutions/ (and only those)"


def test_readme_table_repeats_the_recorded_run_times():
    entry = load_run_times()
    expected = {name: format_seconds(seconds) for name, seconds in entry["seconds"].items()}
    assert readme_run_times() == expected
    readme = (REPO / "README.md").read_text()
    assert entry["date"] in readme and entry["device"] in readme, "the README names where and when they were measured"


def test_start_page_prints_the_recorded_run_times(capsys):
    start = json.loads((REPO / "solutions" / "00-start-here.ipynb").read_text())
    assert any("show_run_times()" in "".join(c["source"]) for c in start["cells"] if c["cell_type"] == "code")
    show_run_times()
    out = capsys.readouterr().out
    entry = load_run_times()
    assert "RECORDED on" in out and entry["date"] in out
    assert all(format_seconds(s) in out for s in entry["seconds"].values())
