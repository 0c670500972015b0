"""Everything that parses or writes student-chosen bytes, tested fast and by property (no workers run here).

Hypothesis generates notebook JSON, worker result lines and report text; bounded example counts keep the
module to a few seconds. The end-to-end versions of these attacks are in test_hostile_class.py.
"""
import csv
import functools
import io
import json
import os
import re
import zipfile

import mistune
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from submission_factory import filled, reference_source, released_notebook

from autograder.exercises import all_exercises
from autograder.exercises.judging.parse import parse_observation
from autograder.grader.batch import _wanted_notebooks
from autograder.grader.escape import csv_cell, file_stem, md_code, md_text, terminal
from autograder.grader.gradebook import _notebook_json, cell_json, gradebook_id
from autograder.grader.messages import BadMessage, TaskResult, parse_line, within_depth
from autograder.grader.notebook import KINDS, Cell, Notebook, NotebookProblem, exercise_cells, parse_notebook
from autograder.grader.report import feedback_markdown, grades_csv, summary_csv
from autograder.grader.rows import Row
from autograder.grader.sandbox.launch import Limits, Sandbox
from autograder.grader.submissions import Received, Refused, Submission, discover, match_notebooks, received

NB, EX = "01_gradient_accumulation.ipynb", "train_with_accumulation"
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=20)
maybe = lambda good: st.one_of(good, json_values)  # a valid value, or any JSON at all
cells = st.fixed_dictionaries({"cell_type": maybe(st.sampled_from(["code", "markdown", "raw"])),
                               "source": maybe(st.text(max_size=40) | st.lists(st.text(max_size=10), max_size=3)),
                               "metadata": maybe(st.fixed_dictionaries({"nbgrader": maybe(st.fixed_dictionaries({
                                   "grade_id": maybe(st.sampled_from([EX, f"test_{EX}", "setup"])),
                                   "solution": maybe(st.booleans()), "grade": maybe(st.booleans()),
                                   "points": maybe(st.integers(0, 20))}))}))})
notebooks = st.fixed_dictionaries({"nbformat": maybe(st.just(4)), "nbformat_minor": maybe(st.integers(0, 5)),
                                   "cells": maybe(st.lists(maybe(cells), max_size=6))})


# ---- the notebook boundary -----------------------------------------------------------------------------

def _check_typed(nb: Notebook, spec) -> None:
    for cell in nb.cells:
        assert cell.kind in KINDS and isinstance(cell.source, str) and not CONTROL.search(cell.source.replace("\r", ""))
        assert cell.grade_id is None or (isinstance(cell.grade_id, str) and len(cell.grade_id) <= 200)
        assert all(isinstance(flag, bool) for flag in (cell.solution, cell.grade, cell.locked, cell.task))
        again = parse_notebook(json.dumps({"nbformat": 4, "cells": [cell_json(cell)]}).encode()).cells[0]
        assert again.source == cell_json(cell)["source"] and again.grade_id == cell.grade_id
    for value in exercise_cells(nb, spec).values():
        assert isinstance(value, str | NotebookProblem)


@FAST
@given(notebooks)
def test_any_notebook_json_is_typed_or_a_reason(course, raw):
    try:
        nb = parse_notebook(json.dumps(raw).encode())
    except NotebookProblem as problem:
        assert str(problem) and len(str(problem)) < 400
        return
    _check_typed(nb, course.notebooks[NB])


@FAST
@given(st.binary(max_size=200))
def test_any_bytes_are_typed_or_a_reason(course, data):
    try:
        _check_typed(parse_notebook(data), course.notebooks[NB])
    except NotebookProblem:
        pass


def _exercise_cell(nb):
    return next(c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == EX)


@pytest.mark.parametrize("damage, reason", [
    (lambda nb: nb["cells"][1].update(metadata=None), "metadata is NoneType"),
    (lambda nb: nb["cells"][1].update(metadata=[]), "metadata is list"),
    (lambda nb: nb["cells"][1].update(source=["x", 42]), "something other than text"),
    (lambda nb: _exercise_cell(nb)["metadata"]["nbgrader"].update(grade_id=[EX]), "grade_id is list"),
    (lambda nb: _exercise_cell(nb)["metadata"]["nbgrader"].update(solution="yes"), "`solution` flag is str"),
    (lambda nb: _exercise_cell(nb).update(source="x" * 2_000_001), "longer than"),
    (lambda nb: _exercise_cell(nb).update(source="print('\x1b]52;c;eA==\x07')"), "control characters"),
    (lambda nb: nb["cells"].append(None), "NoneType, not an object"),
    (lambda nb: nb["cells"].append({"cell_type": "heading", "source": ""}), "cell_type"),
])
def test_malformed_shapes_are_refused_with_a_reason(damage, reason):
    nb = filled(NB, {EX: reference_source(EX)})
    damage(nb)
    with pytest.raises(NotebookProblem, match=re.escape(reason)):
        parse_notebook(json.dumps(nb).encode())


def test_deep_nesting_is_a_reason_not_a_crash():
    with pytest.raises(NotebookProblem, match="nested"):
        parse_notebook(b'{"cells": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def test_released_notebook_parses_and_finds_its_exercise(course):
    nb = parse_notebook(json.dumps(released_notebook(NB)).encode())
    assert isinstance(exercise_cells(nb, course.notebooks[NB])[EX], str)


# ---- the worker's result lines -------------------------------------------------------------------------

KEYS = {"a.ipynb::x"}
lines = st.one_of(
    st.binary(max_size=100),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"key": maybe(st.sampled_from(sorted(KEYS))), "status": maybe(st.sampled_from(["ok", "failed"])),
                           "observation": json_values, "reason": json_values, "output": json_values,
                           "event": maybe(st.just("start"))}).map(lambda v: json.dumps(v).encode()))


@FAST
@given(lines)
def test_any_result_line_is_typed_or_rejected(line):
    try:
        message = parse_line(line, KEYS)
    except BadMessage:
        return
    if isinstance(message, str):
        assert message in KEYS
        return
    assert isinstance(message, TaskResult) and message.key in KEYS and message.status in ("ok", "failed")
    assert (message.status == "ok") == isinstance(message.observation, dict)
    for text in (message.reason, message.output):
        assert isinstance(text, str) and len(text) <= 2000 and not CONTROL.search(text.replace("\t", ""))


@pytest.mark.parametrize("line", [b'{"key": [1], "status": "ok"}', b"[" * 100_000, b'{"key": {"a": 1}}',
                                  b'{"key": "a.ipynb::x", "status": "ok", "observation": ' + b"[" * 40 + b"]" * 40 + b"}"])
def test_hostile_result_lines_are_rejected(line):
    with pytest.raises(BadMessage):
        parse_line(line, KEYS)


@FAST
@given(json_values)
def test_depth_check_agrees_with_recursion(value):
    def depth(v):
        children = list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else None
        return 0 if children is None else 1 + max(map(depth, children), default=0)
    assert within_depth(value, 3) == (depth(value) <= 3)


# ---- outputs that cannot carry an attack ----------------------------------------------------------------

def _row(student="s", feedback="", output="", name=""):
    return Row(student, NB, EX, 0.0, 11.0, feedback, [], output, False, name)


@FAST
@given(st.lists(st.tuples(st.text(max_size=30), st.text(max_size=60), st.text(max_size=20)), min_size=1, max_size=5))
def test_csv_has_one_record_per_row_and_no_formula(rows):
    table = [_row(s or "x", f, name=n) for s, f, n in rows]
    for text in (grades_csv(table), summary_csv(table, [EX])):
        records = list(csv.reader(io.StringIO(text, newline="")))
        assert not CONTROL.search(text.replace("\n", ""))
        for record in records[1:]:
            for cell in record:
                assert not cell.lstrip(" ").startswith(("=", "+", "-", "@", "\t", "\r", "\uff1d")) or \
                    re.fullmatch(r"[+-]?[\d.eE+-]+", cell), cell
    assert len(list(csv.reader(io.StringIO(grades_csv(table), newline="")))) == 1 + len(rows)


def test_csv_keeps_numbers_numeric_and_neutralises_formulas():
    assert [csv_cell(x) for x in ("11", "-1.5", "1e3", "=1+1", "+A1", "-2+3", "@SUM(A1)", "\t=x", "\rx", "＝1")] == \
        ["11", "-1.5", "1e3", "'=1+1", "'+A1", "'-2+3", "'@SUM(A1)", "' =x", " x", "'＝1"]


HTML_TAG = re.compile(r"<(?!/?(p|pre|code|br)\b)[a-zA-Z!/]")


@FAST
@given(st.text(max_size=80))
def test_markdown_text_renders_literally(text):
    rendered = mistune.html(md_text(text))
    assert not HTML_TAG.search(rendered), rendered
    assert "\n" not in md_text(text)


@FAST
@given(st.text(max_size=80))
def test_markdown_code_block_holds_anything(text):
    rendered = mistune.html("\n".join(md_code(text)) + "\nafter\n")
    assert rendered.count("<pre>") == 1 and rendered.rstrip().endswith("<p>after</p>"), rendered


def test_feedback_markdown_cannot_fake_a_grade():
    row = _row("=evil", feedback="x\n\n# Re-graded: 11 / 11\n<script>alert(1)</script><!--",
               output="```\n# Re-graded\n<script>x</script>\n```")
    html = mistune.html(feedback_markdown("<b>evil</b>\x1b[2J", [row]))
    assert "<script" not in html and "<!--" not in html and "<b>" not in html and "\x1b" not in html
    assert len(re.findall("<h1>", html)) == 1 and len(re.findall("<h2>", html)) == 1


@FAST
@given(st.text(max_size=300), st.text(max_size=300))
def test_file_stems_are_unique_bounded_and_portable(a, b):
    for s in (a, b):
        stem = file_stem(s)
        assert len(stem) <= 51 and re.fullmatch(r"[A-Za-z0-9_.@-]+", stem) and not stem.startswith(".")
    assert (file_stem(a) == file_stem(b)) == (a == b)


def test_lookalike_ids_get_their_own_files():
    assert file_stem("kim+lee@x.org") != file_stem("kim_lee@x.org")
    assert gradebook_id("kim+lee@x.org") == "kim+lee@x.org" and gradebook_id("../x") != "../x"
    assert terminal("ok\x1b]52;c;eA==\x07\x1b[2Jdone\r\n") == "okdone "


# ---- who submitted what ---------------------------------------------------------------------------------

def _notebook_bytes(answer=True):
    return json.dumps(filled(NB, {EX: reference_source(EX)}) if answer else released_notebook(NB)).encode()


def test_links_fifos_and_devices_are_refused(tmp_path, course):
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / NB).symlink_to(course.root / "solutions" / "lesson1" / NB)
    (tmp_path / "folder_link").symlink_to(course.root / "solutions" / "lesson1")
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / NB)
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / NB).write_bytes(_notebook_bytes())
    found = {s.student: s for s in discover(tmp_path, course)}
    assert isinstance(found["linked"].files[NB], Refused) and "symbolic link" in found["linked"].files[NB].reason
    assert isinstance(found["fifo"].files[NB], Refused) and "not a regular file" in found["fifo"].files[NB].reason
    assert "folder_link" in found and all(isinstance(v, Refused) for v in found["folder_link"].files.values())
    assert isinstance(found["ok"].files[NB], Received)


def test_zip_links_are_refused(tmp_path, course):
    archive = tmp_path / "download.zip"
    with zipfile.ZipFile(archive, "w") as z:
        link = zipfile.ZipInfo(f"mallory/{NB}")
        link.external_attr = (0o120777 << 16)
        z.writestr(link, "../../solutions/lesson1/" + NB)
        z.writestr(f"alice/{NB}", _notebook_bytes())
    found = {s.student: s for s in discover(archive, course)}
    assert isinstance(found["mallory"].files[NB], Refused) and isinstance(found["alice"].files[NB], Received)


def test_moodle_zip_of_one_student_folder(tmp_path, course):
    archive = tmp_path / "moodle.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(f"Jane Doe_4242_assignsubmission_file_/{NB}", _notebook_bytes())
    (sub,) = discover(archive, course)
    assert (sub.student, sub.name, list(sub.files)) == ("4242", "Jane Doe", [NB])


def test_zip_of_a_folder_of_students_is_unwrapped(tmp_path, course):
    archive = tmp_path / "wrapped.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(f"download/alice/{NB}", _notebook_bytes())
        z.writestr(f"download/bob/{NB}", _notebook_bytes(False))
    assert [s.student for s in discover(archive, course)] == ["alice", "bob"]


def test_canvas_students_with_one_name_stay_apart(tmp_path, course):
    archive = tmp_path / "canvas.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(f"smithjo_1001_9001_{NB}", _notebook_bytes())
        z.writestr(f"smithjo_LATE_1002_9002_{NB.replace('.ipynb', '-1.ipynb')}", _notebook_bytes(False))
    found = discover(archive, course)
    assert [(s.student, s.name, sorted(s.files)) for s in found] == [
        ("1001", "smithjo", [NB]), ("1002", "smithjo", [NB.replace(".ipynb", "-1.ipynb")])]


def test_same_key_different_names_never_merge(tmp_path, course):
    (tmp_path / "1001").mkdir()
    (tmp_path / "1001" / NB).write_bytes(_notebook_bytes())
    (tmp_path / f"smithjo_1001_9001_{NB}").write_bytes(_notebook_bytes(False))
    assert sorted(s.student for s in discover(tmp_path, course)) == ["1001 (1001)", "1001 (smithjo)"]


def test_a_student_folder_without_a_notebook_keeps_its_row(tmp_path, course):
    """nbgrader collects a student who deleted the released notebook as a folder with only timestamp.txt."""
    (tmp_path / "alice" / "lesson1").mkdir(parents=True)
    (tmp_path / "alice" / "lesson1" / NB).write_bytes(_notebook_bytes())
    (tmp_path / "dave" / "lesson1").mkdir(parents=True)
    (tmp_path / "dave" / "lesson1" / "timestamp.txt").write_text("2026-01-01 00:00:00 UTC")
    (tmp_path / ".ipynb_checkpoints").mkdir()
    found = {s.student: s for s in discover(tmp_path, course)}
    assert sorted(found) == ["alice", "dave"] and found["dave"].files == {}
    path, note = match_notebooks(found["dave"], course, [NB])[NB]
    assert path is None and f"No notebook {NB} was submitted" in note


def test_a_notebook_few_students_sent_changes_nobody(course):
    subs = [Submission(f"s{i}", f"s{i}", {NB: received(_notebook_bytes())}) for i in range(3)]
    subs[0].files["02_mixed_precision.ipynb"] = b"{}"
    wanted, left_out = _wanted_notebooks(subs, course)
    assert wanted == [NB] and left_out == {"02_mixed_precision.ipynb": 1}


def test_resume_is_stale_when_isolation_or_limits_change():
    fingerprints = {Sandbox("rlimits", Limits(), None).fingerprint(), Sandbox("bubblewrap", Limits(), None).fingerprint(),
                    Sandbox("bubblewrap", Limits(processes=64), None).fingerprint(), Sandbox("off", Limits(), None).fingerprint()}
    assert len(fingerprints) == 4


def test_typed_cell_json_drops_outputs_and_escapes_html():
    cell = Cell("markdown", "<script>alert(1)</script> & <img src=x>")
    assert cell_json(cell)["source"] == "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;img src=x&gt;"
    assert cell_json(Cell("code", "x = 1", EX, solution=True))["outputs"] == []


# ---- the observation boundary (a student's observation, parsed on the reference's shapes) ---------------

@functools.cache  # loaded once: the property tests below grade against them hundreds of times
def _shipped_references() -> dict[str, dict]:
    from autograder.selfcheck.recorded import load_recorded

    return {ex: load_recorded(ex).observation for ex in all_exercises()}


@pytest.mark.parametrize("exercise", sorted(all_exercises()))
def test_the_reference_parses_as_itself(exercise):
    """An honest observation loses nothing at the boundary: the reference, parsed on itself, is unchanged."""
    reference = _shipped_references()[exercise]
    parsed = parse_observation(reference, reference)
    measured = {key: {k: v for k, v in scenario.items() if k != "truth"}  # reference-only: never the student's
                for key, scenario in reference["scenarios"].items()}
    assert parsed["scenarios"] == measured


@FAST
@given(student=json_values, exercise=st.sampled_from(sorted(all_exercises())))
def test_any_observation_is_shaped_like_the_reference_or_a_reason(student, exercise):
    reference = _shipped_references()[exercise]
    for observation in (student, {"scenarios": student}, {"scenarios": {k: student for k in reference["scenarios"]}}):
        parsed = parse_observation(observation, reference)
        assert list(parsed["scenarios"]) == list(reference["scenarios"])
        for key, scenario in parsed["scenarios"].items():
            assert scenario["case"] == reference["scenarios"][key]["case"]
            if "error" in scenario:
                assert isinstance(scenario["error"], str) and len(scenario["error"]) <= 400
        results = all_exercises()[exercise].grade(observation, reference)
        assert sum(r.score for r in results) == 0 and all(len(r.feedback) <= 1000 for r in results)


@pytest.mark.parametrize("forged", [
    {"ranks": []},                                     # `launch = lambda *a, **k: []`: no rank reported anything
    {"ranks": [{}] * 40},                              # far too many ranks
    {"error": "x" * 2_400_000},                        # a 2.4 MB error message
    {"ranks": "\u202e" * 10},                          # text where the ranks belong
])
def test_forged_rank_results_earn_nothing_and_stay_short(forged):
    """What a cell that replaces the grader's launcher or rank function could report, for every rank exercise."""
    for exercise, reference in _shipped_references().items():
        if not any("ranks" in s for s in reference["scenarios"].values()):
            continue
        student = {"scenarios": {k: forged for k in reference["scenarios"]}}
        results = all_exercises()[exercise].grade(student, reference)
        assert sum(r.score for r in results) == 0, (exercise, [r.title for r in results if r.score])
        assert all(len(r.feedback) <= 1000 for r in results)


def test_a_numeric_vector_must_keep_its_length():
    reference = {"salt": 0, "scenarios": {"a": {"case": {"what": "called"}, "params": [float(i) for i in range(9)],
                                                "shape": [2, 3]}}}
    short = parse_observation({"scenarios": {"a": {"params": [1.0, 2.0], "shape": [2, 3]}}}, reference)
    assert short["scenarios"]["a"]["error"] == "different: `params` has 2 values where the reference's has 9"
    mixed = parse_observation({"scenarios": {"a": {"params": [1.0, "x"] * 5, "shape": [2, 3]}}}, reference)
    assert mixed["scenarios"]["a"]["error"].startswith("malformed: params is not 9 numbers")
    shape = parse_observation({"scenarios": {"a": {"params": [0.0] * 9, "shape": [1, 2, 3]}}}, reference)
    assert shape["scenarios"]["a"]["shape"] == [1, 2, 3]  # a few numbers (a shape) may differ in length
    huge = parse_observation({"scenarios": {"a": {"params": [[0] * 300] * 300}}}, reference)
    assert "error" in huge["scenarios"]["a"]


def test_a_record_may_be_an_error_record_and_a_check_reports_it():
    """zero_memory_per_rank's blank scaffold: every call raised, and the student reads that, not a parse error."""
    reference = _shipped_references()["zero_memory_per_rank"]
    student = {"scenarios": {k: {"calls": [{"error": "ValueError: negative", "value_error": True, "junk": "x" * 10**5}
                                           for _ in s["calls"]]}
                             for k, s in reference["scenarios"].items()}}
    parsed = parse_observation(student, reference)
    first = next(iter(parsed["scenarios"].values()))
    assert first["calls"][0] == {"error": "ValueError: negative", "value_error": True}
    results = all_exercises()["zero_memory_per_rank"].grade(student, reference)
    assert any("raised ValueError: negative" in r.feedback for r in results)
    assert not any("could not read" in r.feedback for r in results)


def test_the_autograded_notebook_restores_the_course_locked_cells():
    """As `nbgrader autograde` does: a student's rewritten test cell, unlocked and worth 1000 points, is shown to the
    instructor as the course's own test cell; the exercise cell keeps the student's code."""
    released = released_notebook(NB)
    forged = filled(NB, {EX: "def train_with_accumulation(*a):\n    return 0.0\n"})
    for cell in forged["cells"]:
        grader = cell.get("metadata", {}).get("nbgrader", {})
        if grader.get("grade_id") == f"test_{EX}":
            cell["source"] = "print('train_with_accumulation: 11 / 11 points')\n11"
            grader.update(locked=False, points=1000)
    nb = _notebook_json(parse_notebook(json.dumps(forged).encode()), released)
    by_id = {c["metadata"]["nbgrader"]["grade_id"]: c for c in nb["cells"] if "nbgrader" in c["metadata"]}
    course = {c["metadata"]["nbgrader"]["grade_id"]: c for c in released["cells"] if "nbgrader" in c.get("metadata", {})}
    test = by_id[f"test_{EX}"]
    assert test["source"] == "".join(course[f"test_{EX}"]["source"]) and test["metadata"]["nbgrader"]["points"] == 11
    assert test["metadata"]["nbgrader"]["locked"] is True
    assert by_id[EX]["source"].startswith("def train_with_accumulation(*a)")
