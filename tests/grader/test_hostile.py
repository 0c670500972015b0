"""Hostile submissions: each scores 0 with a clear reason, and honest students in the same batch keep full marks.

Every hostile cell below would earn marks, or break grading, under plain in-kernel nbgrader grading.
Where a cell *could* cheat if the sandbox let it (read the solutions, reach the network), it cheats when
it can and fails loudly when it cannot, so a 0 proves the door was shut. The batch is graded twice: by
root (workers switch to unprivileged uids) and by an ordinary Unix user (see grader_user.py).
"""
import csv
import os
import shutil
from pathlib import Path

import pytest
from grader_user import USER, grade, is_root, shared_folder
from submission_factory import filled, reference_source, write

NB = "01_gradient_accumulation.ipynb"
EX = "train_with_accumulation"
REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.serial]  # make test: alone, after the others

WRONG_BODY = '''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    return 0.0  # trains nothing
'''

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
''' + WRONG_BODY, "shaped differently"),
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
HONEST = ["honest_1", "honest_2", "honest_3"]


def _sandbox_processes():
    """Live processes of the uids sandboxes run as (64000 and up), or of the test user (zombies waiting for
    this machine's init to collect them run nothing)."""
    import pwd

    try:
        user = pwd.getpwnam(USER).pw_uid if is_root() else -1
    except KeyError:
        user = -1
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = open(f"/proc/{pid}/status").read().splitlines()
            uid = int(next(line for line in status if line.startswith("Uid:")).split()[1])
            zombie = any(line.startswith("State:") and "Z" in line for line in status)
        except (OSError, StopIteration):
            continue
        if not zombie and (64000 <= uid < 65000 or uid == user):
            found.append(pid)
    return found


@pytest.fixture(scope="module", params=["root", "user"])
def graded(request):
    if request.param == "root" and not is_root():
        pytest.skip("the grader runs as this (ordinary) user in the other parameter")
    work = shared_folder("hostile-")
    submissions, out = work / "in", work / "out"
    for student, (source, _) in HOSTILE.items():
        write(submissions, student, NB, filled(NB, {EX: source}))
    for student in HONEST:
        write(submissions, student, NB, filled(NB, {EX: reference_source(EX)}))
    run = grade(submissions, out, "--timeout", "8", as_user=request.param == "user", timeout=1200)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(out / "grades.csv", newline="") as f:
        table = {r["student"]: r for r in csv.DictReader(f)}
    left = _sandbox_processes()
    yield table, run, left
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("student", sorted(HOSTILE))
def test_hostile_scores_zero_with_reason(graded, student):
    table, *_ = graded
    row = table[student]
    assert float(row["score"]) == 0.0, row
    assert HOSTILE[student][1] in row["feedback"], row


def test_honest_students_keep_full_marks(graded):
    table, *_ = graded
    for student in HONEST:
        assert float(table[student]["score"]) == float(table[student]["max_score"]) > 0, table[student]


def test_nothing_escaped(graded):
    table, run, left = graded
    assert "isolation: bubblewrap" in run.stdout or "bwrap" in run.stderr
    assert not (REPO / "autograder" / "pwned.py").exists()
    assert left == [], "a sandboxed process outlived grading"
    assert len(table) == len(HOSTILE) + len(HONEST)
