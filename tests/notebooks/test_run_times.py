"""One source for lesson run times: coursekit/results/lesson_times.json, written by `python -m bench.lesson_times`.

The start page prints that file (coursekit.run_times.show_run_times) and the README's lesson table is generated from
it; this test fails when a lesson has no recorded time. No timing is measured here.
"""
import json
from pathlib import Path

from coursekit.run_times import format_seconds, load_run_times, show_run_times

REPO = Path(__file__).resolve().parents[2]
LESSONS = sorted(str(p.relative_to(REPO / "solutions")) for p in (REPO / "solutions").rglob("*.ipynb")
                 if ".ipynb_checkpoints" not in p.parts)


def test_every_lesson_has_a_recorded_run_time_with_provenance():
    entry = load_run_times()
    assert entry is not None, "coursekit/results/lesson_times.json is missing: run python -m bench.lesson_times"
    assert all(isinstance(entry.get(k), str) and entry[k] for k in ("device", "torch", "date", "conditions"))
    assert sorted(entry["seconds"]) == LESSONS, "record the run time of every notebook in solutions/ (and only those)"


def test_readme_table_repeats_the_recorded_run_times():
    """The README's table is generated from lesson_times.json (autograder/authoring/readme.py; test_course.py checks
    it is current): every recorded time appears there, with where and when it was measured."""
    from autograder.authoring.course import load_course
    from autograder.authoring.readme import lessons_table

    entry = load_run_times()
    table = lessons_table(load_course())
    assert all(format_seconds(seconds) in table for seconds in entry["seconds"].values())
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


def test_a_re_measured_notebook_leaves_its_earlier_conditions():
    from bench.lesson_times import superseded

    before = ("kernel start included; load 3; re-measured 2026-12-05 (load 9): a.ipynb, b.ipynb; "
              "re-measured 2026-12-06 (load 8): c.ipynb")
    assert superseded(before, {"b.ipynb", "c.ipynb"}) == "kernel start included; load 3; re-measured 2026-12-05 (load 9): a.ipynb"
    assert superseded(before, set()) == before
