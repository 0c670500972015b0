"""Hostile class uploads (issue 15), graded the way an instructor grades: one batch, with --gradebook, next to
honest students, with the grader run as root and as an ordinary Unix user.

Each attack once stopped the whole batch, injected output, leaked a secret or harmed another student. The
fair outcome: this student gets 0 or a clear reason; every other student is unaffected; every output is
written and inert. The same batch holds hostile cells (``HOSTILE``: exits, hangs, fork bombs, patched comparisons,
reads of the solutions, the network, writes outside): each scores 0 with a clear reason, and honest students next
to them keep full marks. One batch per identity serves every test (each costs tens of seconds of fixed work). A
second batch grades CPU/thread/process/memory hogs *concurrently* with honest students.
"""
import csv
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import mistune
import pytest
from grader_user import REPO, USER, grade, is_root, shared_folder
from submission_factory import filled, reference_source, released_notebook

from autograder.grader.escape import file_stem

NB, EX = "01_gradient_accumulation.ipynb", "train_with_accumulation"
KEY = f"{NB}::{EX}"
SECRET = "grader-secret-7f3a91"
pytestmark = [pytest.mark.slow, pytest.mark.serial]  # make test: alone, after the others

WRONG = "\ndef train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):\n    return 0.0\n"
RESULTS_FD = "import os, sys\nfd = int(sys.argv[sys.argv.index('--results-fd') + 1])\n"


def raising(name: str, message: str) -> str:
    """A function that raises a BaseException subclass (it escapes observe) with a chosen class name and text."""
    return (f"def train_with_accumulation(*args, **kwargs):\n"
            f"    raise type({name!r}, (BaseException,), {{}})({message!r})\n")


def with_cells(change) -> dict:
    nb = filled(NB, {EX: reference_source(EX)})
    change(nb["cells"])
    return nb


def code_cell(cells, grade_id=None):
    return next(c for c in cells if c["cell_type"] == "code"
                and (grade_id is None or c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id))


def _set(cell, key, value):
    cell[key] = value


def _deep() -> bytes:
    return b'{"nbformat": 4, "cells": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def _with_html_outputs(cells):
    code_cell(cells, EX)["outputs"] = [{"output_type": "display_data", "metadata": {}, "data": {
        "text/html": "<script>alert('formgrader')</script>", "application/javascript": "alert(1)",
        "text/plain": "x"}}]
    cells.insert(0, {"cell_type": "markdown", "metadata": {}, "source": "<img src=x onerror=alert(2)> hello"})


REFERENCE_RETURN = json.loads((REPO / "autograder" / "references" / f"{EX}.json").read_text())[
    "observation"]["scenarios"]["default"]["returned"]

# student: {file: content}. Content: a dict (notebook JSON), bytes, ("symlink", target) or ("fifo",).
CLASS = {
    "honest_a": {NB: filled(NB, {EX: reference_source(EX)})},
    "honest_b": {NB: filled(NB, {EX: reference_source(EX)})},
    # --- one upload used to stop the whole class ---
    "nb_metadata_null": {NB: with_cells(lambda cells: _set(code_cell(cells), "metadata", None))},
    "nb_source_number": {NB: with_cells(lambda cells: _set(code_cell(cells, EX), "source", ["x = 1\n", 42]))},
    "nb_grade_id_list": {NB: with_cells(lambda cells: code_cell(cells, EX)["metadata"]["nbgrader"].update(grade_id=[EX]))},
    "nb_renamed_metadata_list": {"my lesson.ipynb": with_cells(lambda cells: _set(cells[-1], "metadata", []))},
    "nb_deeply_nested": {NB: _deep()},
    "nb_escape_in_source": {NB: filled(NB, {EX: "# \x1b]52;c;cHduZWQ=\x07\n" + reference_source(EX)})},
    "pipe_list_key": {NB: filled(NB, {EX: RESULTS_FD + "os.write(fd, b'{\"key\": [1], \"status\": \"ok\"}\\n')\n" + WRONG})},
    "pipe_deep_array": {NB: filled(NB, {EX: RESULTS_FD + "os.write(fd, b'[' * 100000 + b'\\n')\n" + WRONG})},
    "pipe_forged_result": {NB: filled(NB, {EX: RESULTS_FD + (
        "line = '{\"key\": \"%s\", \"status\": \"ok\", \"observation\": {\"scenarios\": {}}}\\n' % " + repr(KEY) + "\n"
        "os.write(fd, line.encode())\n") + WRONG})},
    # --- the time limit, from outside: the task stops its own worker and leaves a detached child. The batch grades
    # students by name and this one holds its slot for the time limit plus the grader's grace (23 s where the stop
    # works): named to be among the first, so that wait overlaps the rest of the batch instead of ending it ---
    "a_stops_its_worker": {NB: filled(NB, {EX: RESULTS_FD + f'''
import signal, time
if os.fork() == 0:
    os.setsid()
    time.sleep(1)
    try:
        os.write(fd, b'{{"key": "{KEY}", "status": "failed", "reason": "FORGED by a detached child"}}\\n')
    except OSError:
        pass
    while True:
        time.sleep(0.2)
os.kill(os.getppid(), signal.SIGSTOP)
''' + WRONG})},
    # --- output injection ---
    "csv_formula": {NB: filled(NB, {EX: raising('=HYPERLINK("http://evil.example/?g","Re-grade")', "click")})},
    "csv_bare_cr": {NB: filled(NB, {EX: raising("Err", "one\rforged,row,here,11,11\rtwo")})},
    "terminal_escapes": {NB: filled(NB, {EX: raising("Err", "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\x9b31m")})},
    "markdown_injection": {NB: filled(NB, {EX: "print('```\\n# Re-graded: 11 / 11\\n<script>alert(2)</script>')\n" + raising(
        "Err", "\n\n# Re-graded: 11 / 11 points\n<script>alert(1)</script>\n<!--")})},
    "html_outputs": {NB: with_cells(_with_html_outputs)},
    # --- students hurting students ---
    "kim+lee@uni.example": {NB: filled(NB, {EX: reference_source(EX)})},
    "kim_lee@uni.example": {NB: released_notebook(NB)},
    "extra_lesson_upload": {NB: filled(NB, {EX: reference_source(EX)}), "02_mixed_precision.ipynb": b"{}"},
    "L" * 250: {NB: filled(NB, {EX: reference_source(EX)})},
    # --- secrets and solutions ---
    "symlink_to_solution": {NB: ("symlink", REPO / "solutions" / "lesson1" / NB)},
    "fifo_instead_of_file": {NB: ("fifo",)},
    "reads_pid1_environ": {NB: filled(NB, {EX: "env = open('/proc/1/environ', 'rb').read().replace(b'\\0', b' ')\n"
                                               "raise RuntimeError(env.decode(errors='replace')[:400])\n"})},
    "fills_dev_shm": {NB: filled(NB, {EX: "for i in range(80):  # 4 MiB files: each under the 8 MiB file limit\n"
                                          "    with open(f'/dev/shm/fill{i}', 'wb') as f:\n"
                                          "        f.write(b'x' * (4 << 20))\n" + WRONG})},
    # --- a constant earns nothing ---
    "returns_a_constant": {NB: filled(NB, {EX: "def train_with_accumulation(model, dataloader, optimizer, criterion, "
                                               f"accumulation_steps=4):\n    return {REFERENCE_RETURN!r}\n"})},
}

ZERO_WITH_REASON = {
    "nb_metadata_null": "metadata is NoneType",
    "nb_source_number": "holding something other than text",
    "nb_grade_id_list": "grade_id is list",
    "nb_renamed_metadata_list": "No notebook 01_gradient_accumulation.ipynb was submitted",
    "nb_deeply_nested": "nested far too deeply",
    "nb_escape_in_source": "control characters",
    "pipe_list_key": "Bad file descriptor",
    "pipe_deep_array": "Bad file descriptor",
    "pipe_forged_result": "Bad file descriptor",
    "a_stops_its_worker": "did not finish within 8 s",
    "csv_formula": "HYPERLINK",
    "symlink_to_solution": "symbolic link",
    "fifo_instead_of_file": "not a regular file",
    "fills_dev_shm": "No space left on device",
}
# Students whose cell signals its worker: under one identity the zygote is PID 1 and ignores it, so the cell goes on
# to its wrong body and scores 0 for it.
STOPS_THE_WORKER = {"a_stops_its_worker", "kills_grader_worker"}
UNSTOPPABLE = "returns the same value whatever the data"
FULL = ["honest_a", "honest_b", "html_outputs", "kim+lee@uni.example", "extra_lesson_upload", "L" * 250]

WRONG_BODY = '''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    return 0.0  # trains nothing
'''

# --- hostile cells (once tests/grader/test_hostile.py's own batch): each would earn marks, or break grading, under plain
# in-kernel nbgrader grading; where a cell *could* cheat if the sandbox let it, it cheats when it can and fails loudly
# when it cannot, so a 0 proves the door was shut ---
HOSTILE = {  # student: (cell source, phrase expected in the feedback)
    "exits_at_definition": ("import os\nos._exit(0)\n" + WRONG_BODY, "ended the process"),
    "sys_exit_in_function": ("import sys\ndef train_with_accumulation(*a, **k):\n    sys.exit(0)\n", "SystemExit"),
    "hangs_at_definition": ("while True:\n    pass\n", "did not finish within"),
    "hangs_in_function": ("def train_with_accumulation(*a, **k):\n    while True:\n        pass\n", "did not finish within"),
    "floods_output": ("import sys\nwhile True:\n    sys.stdout.write('spam' * 10000)\n", "more output than the grader allows"),
    "giant_allocation": ("import torch\nhog = torch.empty(2 ** 42)\n" + WRONG_BODY, "can't allocate memory"),
    "fork_bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
                  "did not finish within"),
    "kills_grader_worker": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + WRONG_BODY,
                            "stopped the grading worker"),
    "patches_comparisons": ('''
import math, torch, numpy
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
math.isclose = lambda *a, **k: True
numpy.allclose = lambda *a, **k: True
import autograder.exercises.judging.checking as ex
ex.close = lambda *a, **k: True
ex.max_abs_diff = lambda *a, **k: 0.0
''' + WRONG_BODY, "returns_a_constant"),
    "replaces_exceptions_and_hooks": ('''
import builtins, sys
builtins.AssertionError = type("AssertionError", (Exception,), {})
builtins.Exception = type("Exception", (BaseException,), {})
sys.excepthook = lambda *a: None
sys.displayhook = lambda value: None
''' + WRONG_BODY, "returns_a_constant"),
    "fakes_the_observation": ('''
import autograder.exercises.train_with_accumulation.observe as me
from autograder.exercises.train_with_accumulation.cases import SCENARIOS
def fake(fn, **kwargs):
    return {"scenarios": {k: {"returned_is_float": True, "returned_has_graph": False, "returned_type": "float",
            "returned": 1.0, "steps": 2, "step_grads": [], "params": [], "training": True, "max_graphs_alive": 0}
            for k in SCENARIOS}}
me.observe = fake
''' + WRONG_BODY, "shaped otherwise"),
    "copies_the_reference_solution": ('''
import json, glob, os, autograder
repo = os.path.dirname(os.path.dirname(autograder.__file__))
paths = [p for pattern in (f"{repo}/solutions/*/*.ipynb", f"{repo}/**/*.ipynb", "/home/**/*.ipynb", "/srv/**/*.ipynb")
         for p in glob.glob(pattern, recursive=True)]
if not paths:
    raise RuntimeError("no solutions visible")
cells = json.load(open(paths[0]))["cells"]
exec("".join(next(c["source"] for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id") == "train_with_accumulation")))
''', "no solutions visible"),
    "imports_the_reference_loader": ('''
from autograder.authoring.course import reference_function
train_with_accumulation = reference_function("train_with_accumulation")
''', "solutions"),
    "reads_the_gradebook": ('''
import os, autograder
classroom = os.path.join(os.path.dirname(os.path.dirname(autograder.__file__)), "classroom")
if not os.path.isdir(classroom) or not os.listdir(classroom):
    raise RuntimeError("the course folder is empty here")
''' + WRONG_BODY, "empty here"),
    "uses_the_network": ('''
import socket
socket.create_connection(("1.1.1.1", 443), timeout=3)
''' + WRONG_BODY, "Network is unreachable"),
    "writes_outside_its_folder": ('''
import autograder, os
open(os.path.join(os.path.dirname(autograder.__file__), "pwned.py"), "w").write("x = 1")
''' + WRONG_BODY, "Read-only file system"),
    "leaves_a_daemon_behind": ('''
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            time.sleep(1)
    os._exit(0)
''' + WRONG_BODY, "returns_a_constant"),
}
# The honest students graded in the same batch as the hostile cells (test_hostile.py had three of its own; in the
# one batch the class's honest pair stands next to them: every student of the batch sorts the same way, by name).
HONEST = ["honest_a", "honest_b"]
CLASS |= {student: {NB: filled(NB, {EX: source})} for student, (source, _) in HOSTILE.items()}


def write_class(folder, students):
    for student, files in students.items():
        for name, content in files.items():
            path = folder / student / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, tuple) and content[0] == "symlink":
                path.symlink_to(content[1])
            elif isinstance(content, tuple):
                os.mkfifo(path)
            else:
                path.write_bytes(content if isinstance(content, bytes) else json.dumps(content, indent=1).encode())


def read_rows(out):
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module", params=["root", "user"])
def hostile_class(request):
    if request.param == "root" and not is_root():
        pytest.skip("the grader runs as this (ordinary) user in the other parameter")
    work = shared_folder("hostile-class-")
    submissions, out, course = work / "in", work / "out", work / "course"
    write_class(submissions, CLASS)
    course.mkdir()
    run = grade(submissions, out, "--timeout", "8", "--jobs", "2", "--gradebook", as_user=request.param == "user",
                env={"SECRET_TOKEN": SECRET, "NBGRADER_COURSE_ROOT": str(course)})
    assert leftover_processes() == [], "a sandboxed process outlived grading"
    yield request.param, run, out, course, read_rows(out) if (out / "grades.csv").exists() else []
    shutil.rmtree(work, ignore_errors=True)


def by_student(rows):
    return {r["student"]: r for r in rows}


def test_the_batch_completes_with_every_output(hostile_class):
    who, run, out, course, rows = hostile_class
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(r["student"] for r in rows) == sorted(CLASS), "one row per student (and only Lesson 1)"
    assert {r["notebook"] for r in rows} == {NB}, "another lesson's {} upload added rows for everyone"
    for student in CLASS:
        assert (out / "feedback" / f"{file_stem(student)}.md").exists(), student
    assert "recorded" in run.stdout


@pytest.mark.parametrize("student", sorted(ZERO_WITH_REASON))
def test_attack_scores_zero_with_reason(hostile_class, student):
    who, *_, rows = hostile_class
    row = by_student(rows)[student]
    expected = UNSTOPPABLE if student in STOPS_THE_WORKER and one_identity(who) else ZERO_WITH_REASON[student]
    assert float(row["score"]) == 0 and expected in row["feedback"], row


def test_honest_students_keep_full_marks(hostile_class):
    *_, out, _, rows = hostile_class
    table = by_student(rows)
    for student in FULL:
        assert table[student]["score"] == table[student]["max_score"] == "11", table[student]
    summary = {r["student"]: r for r in csv.DictReader(open(out / "summary.csv", newline="", encoding="utf-8"))}
    assert summary["honest_a"]["percent"] == "100.0" and "02" not in "".join(summary["honest_a"]), summary["honest_a"]


def test_time_limit_holds_from_outside(hostile_class):
    who, *_, rows = hostile_class
    row = by_student(rows)["a_stops_its_worker"]
    stopped = UNSTOPPABLE if one_identity(who) else "grader stopped it"  # one identity: its SIGSTOP does nothing
    assert stopped in row["feedback"] and "FORGED" not in row["feedback"], row


def one_identity(who: str) -> bool:
    """The grader ran as the ordinary test user without subordinate uids: every worker has its uid, and the zygote is
    its sandbox's PID 1, which a signal from inside does not stop or kill (docs/grading.md)."""
    try:
        ranges = Path("/etc/subuid").read_text().splitlines()
    except OSError:
        ranges = []
    return who == "user" and not any(line.startswith(f"{USER}:") for line in ranges)


def test_csv_cells_are_inert(hostile_class):
    *_, out, _, rows = hostile_class
    raw = (out / "grades.csv").read_text(encoding="utf-8")
    parsed = list(csv.reader(io.StringIO(raw, newline="")))
    assert len(parsed) == 1 + len(CLASS), "a bare CR split a record"
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", raw.replace("\n", ""))
    for record in parsed[1:]:
        for cell in record:
            assert not cell.lstrip(" ").startswith(("=", "+", "-", "@", "\t", "\r")) or re.fullmatch(r"-?[\d.]+", cell)
    assert by_student(rows)["csv_formula"]["feedback"].startswith("'=HYPERLINK")
    assert "forged,row" in by_student(rows)["csv_bare_cr"]["feedback"]  # kept as text, inside its own cell


def test_no_escape_sequences_anywhere(hostile_class):
    _, run, out, course, _ = hostile_class
    texts = [run.stdout, run.stderr] + [p.read_text(encoding="utf-8", errors="replace")
                                        for p in [*out.rglob("*.csv"), *out.rglob("*.md"), *out.rglob("*.html"),
                                                  *course.rglob("*.ipynb")]]
    for text in texts:
        assert "\x1b" not in text and "\x9b" not in text and "\x07" not in text


def test_markdown_feedback_renders_literally(hostile_class):
    *_, out, _, _ = hostile_class
    for student in ("markdown_injection", "csv_formula", "terminal_escapes"):
        html = mistune.html((out / "feedback" / f"{file_stem(student)}.md").read_text(encoding="utf-8"))
        assert "<script" not in html and "<!--" not in html, student
        assert len(re.findall(r"<h1>", html)) == 1 and "Re-graded" not in "".join(re.findall(r"<h\d>.*?</h\d>", html))


def test_autograded_notebooks_carry_no_html_or_solution(hostile_class):
    """Formgrader renders these in the instructor's Jupyter origin: no student output, markup or metadata."""
    *_, course, _ = hostile_class
    autograded = {p.parts[-3]: json.loads(p.read_text()) for p in (course / "autograded").rglob("*.ipynb")}
    assert {"html_outputs", "symlink_to_solution"} <= set(autograded)
    for student, nb in autograded.items():
        for cell in nb["cells"]:
            assert set(cell["metadata"]) <= {"nbgrader"}, (student, cell["metadata"])
            for output in cell.get("outputs", []):
                assert set(output.get("data", {})) <= {"text/plain"}, (student, output)
            if cell["cell_type"] != "code":
                assert "<script" not in cell["source"] and "<img" not in cell["source"], (student, cell["source"])
    shown = "".join(c["source"] for c in autograded["symlink_to_solution"]["cells"])
    assert reference_source(EX).strip() not in shown, "the linked solution notebook was handed back"


def test_students_never_share_a_file_or_row(hostile_class):
    *_, out, _, rows = hostile_class
    table = by_student(rows)
    assert table["kim+lee@uni.example"]["score"] == "11" and table["kim_lee@uni.example"]["score"] == "0"
    plus = (out / "feedback" / f"{file_stem('kim+lee@uni.example')}.md").read_text(encoding="utf-8")
    under = (out / "feedback" / f"{file_stem('kim_lee@uni.example')}.md").read_text(encoding="utf-8")
    assert "11 / 11" in plus and "0 / 11" in under
    assert max(len(p.name) for p in (out / "feedback").iterdir()) <= 60
    index = list(csv.DictReader(open(out / "feedback" / "index.csv", newline="", encoding="utf-8")))
    assert len({r["markdown"] for r in index}) == len(CLASS)


def test_no_secret_reaches_the_sandbox(hostile_class):
    who, run, out, _, rows = hostile_class
    row = by_student(rows)["reads_pid1_environ"]
    assert SECRET not in (out / "grades.csv").read_text(encoding="utf-8") + run.stdout + run.stderr
    assert float(row["score"]) == 0
    if who == "user":  # PID 1 is the zygote itself there (launch.py): undumpable, its environment is not readable
        assert "Permission denied: '/proc/1/environ'" in row["feedback"], row


def test_one_warning_at_most(hostile_class):
    who, run, *_ = hostile_class
    assert run.stderr.count("WARNING") <= 1, run.stderr
    if who == "user":
        assert "no per-student CPU share" in run.stderr


def test_a_constant_earns_nothing(hostile_class):
    *_, out, _, rows = hostile_class
    row = by_student(rows)["returns_a_constant"]
    assert float(row["score"]) == 0, row
    assert f"{REFERENCE_RETURN:.4f}" not in (out / "feedback" / f"{file_stem('returns_a_constant')}.md").read_text()


@pytest.mark.parametrize("student", sorted(HOSTILE))
def test_hostile_scores_zero_with_reason(hostile_class, student):
    *_, rows = hostile_class
    row = by_student(rows)[student]
    assert float(row["score"]) == 0.0, row
    expected = UNSTOPPABLE if student in STOPS_THE_WORKER and one_identity(hostile_class[0]) else HOSTILE[student][1]
    assert expected in row["feedback"], row


def test_honest_students_next_to_hostile_cells_keep_full_marks(hostile_class):
    *_, rows = hostile_class
    table = by_student(rows)
    for student in HONEST:
        assert float(table[student]["score"]) == float(table[student]["max_score"]) > 0, table[student]


def test_nothing_escaped(hostile_class):
    """(No sandboxed process outlived grading: the fixture checks it as soon as the grader returns.)"""
    _, run, _, _, rows = hostile_class
    assert "isolation: bubblewrap" in run.stdout or "bwrap" in run.stderr
    assert not (REPO / "autograder" / "pwned.py").exists()
    assert sum(r["student"] in HOSTILE or r["student"] in HONEST for r in rows) == len(HOSTILE) + len(HONEST)


# ---- one student must not starve or fail another ----------------------------------------------------------

HOG_TIMEOUT = 30  # each hog holds its resource until the grader kills it at its time limit
NB3, EX3 = "03_data_parallel.ipynb", "average_gradients"  # honest students here start real rank processes
HONEST_LATE = "import time\ntime.sleep(6)  # start once the hogs are in full swing\n"
HOGS = {
    "hog_cpu_sessions": '''
import os
for _ in range(300):
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
while True:
    pass
''',
    "hog_threads": '''
import threading, time
for _ in range(500):
    try:
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    except RuntimeError:  # the limit: hold what it got
        break
time.sleep(3600)
''',
    "hog_processes": '''
import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(3600)
    except OSError:
        break
time.sleep(3600)
''',
    "hog_memory": '''
import os, time
for _ in range(4):
    if os.fork() == 0:
        block = bytearray(450 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(3600)
time.sleep(3600)
''',
}


@pytest.fixture(scope="module", params=["root", "user"])
def hogs_graded(request):
    if request.param == "root" and not is_root():
        pytest.skip("the grader runs as this (ordinary) user in the other parameter")
    work = shared_folder("hostile-hogs-")
    students = {name: {NB: filled(NB, {EX: source + WRONG})} for name, source in HOGS.items()}
    students |= {f"honest_{i}": {NB3: filled(NB3, {EX3: HONEST_LATE + reference_source(EX3)})} for i in range(3)}
    write_class(work / "in", students)
    # All seven graded at once; the user gets a delegated cgroup subtree, as an admin would give it.
    run = grade(work / "in", work / "out", "--jobs", str(len(students)), "--timeout", str(HOG_TIMEOUT),
                "--notebook", NB, "--notebook", NB3, "--total-memory-gb", "1",
                as_user=request.param == "user", delegate=request.param == "user")
    assert leftover_processes() == [], "a sandboxed process outlived grading"
    rows = read_rows(work / "out") if (work / "out" / "grades.csv").exists() else []
    own = {r["student"]: r for r in rows if (r["exercise"] == EX3) == r["student"].startswith("honest")}
    yield run, own  # each student's row for the lesson they submitted
    shutil.rmtree(work, ignore_errors=True)


def test_hogs_do_not_starve_honest_students(hogs_graded):
    run, table = hogs_graded
    assert run.returncode == 0, run.stderr[-3000:]
    assert "cgroup" in run.stdout and "WARNING" not in run.stderr, run.stdout + run.stderr
    for i in range(3):
        assert table[f"honest_{i}"]["score"] == "11", table[f"honest_{i}"]
    for hog in HOGS:
        assert float(table[hog]["score"]) == 0, table[hog]


def leftover_processes() -> list[str]:
    """Live processes of the sandbox uids (root's grader) or of the test user (the user's grader); zombies
    (ended, waiting for this machine's init to collect them) are not running anything."""
    import pwd

    try:
        user_uid = pwd.getpwnam(USER).pw_uid
    except KeyError:
        user_uid = -1
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and (64000 <= uid < 65000 or (is_root() and uid == user_uid)):
            left.append(pid)
    return left


def test_no_cgroup_left_behind(hogs_graded):
    """Every group a finished grader made is gone (groups of graders still running elsewhere may exist)."""
    for controller in ("cpu", "memory", "pids"):
        root = f"/sys/fs/cgroup/{controller}"
        found = subprocess.run(["find", root, "-maxdepth", "4", "-type", "d", "-name", "autograder-[0-9]*"],
                               capture_output=True, text=True).stdout.split() if os.path.isdir(root) else []
        dead = [f for f in found if not os.path.exists(f"/proc/{os.path.basename(f).split('-')[1]}")]
        assert dead == [], dead
