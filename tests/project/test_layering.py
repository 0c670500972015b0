"""Dependencies point one way, read from the source import by import (function-level imports included).

* The lessons' helpers (coursekit) import nothing of ours; benchmarks and the hub import the packages, never the
  tests.
* Inside the grader: ``exercises`` ← ``selfcheck`` ← ``authoring`` ← ``grader``; the package's entry points
  (``autograder/__init__.py``, ``cli.py``, ``__main__.py``) glue them. What ships to students (exercises,
  selfcheck) never reaches the grader or the authoring tools.
* The verdict is plain Python: an exercise's ``checks.py``, ``cases.py`` and ``__init__.py`` and the shared pure
  modules import neither torch nor anything that does; only ``observe.py`` and the observing helpers do. The class
  grader's own process never imports torch.
"""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OURS = {"coursekit", "autograder", "bench", "hub", "tests"}
MAY_IMPORT = {  # part → the parts its modules may import (besides itself)
    "coursekit": set(),
    "autograder.exercises": {"coursekit"},
    "autograder.selfcheck": {"autograder.exercises"},
    "autograder.authoring": {"autograder.exercises", "autograder.selfcheck", "coursekit"},
    "autograder.grader": {"autograder.exercises", "autograder.selfcheck", "autograder.authoring", "coursekit"},
    "autograder": {"autograder.exercises", "autograder.selfcheck", "autograder.authoring", "autograder.grader"},
}
EVERYTHING = {"coursekit", *MAY_IMPORT}
MAY_IMPORT |= {"bench": EVERYTHING, "hub": EVERYTHING}
# The observing side of the exercises lives in one folder: what runs beside the student's code and may import torch
# (exercises/beside/); everything else of exercises/ but each exercise's observe.py judges, in plain Python.
BESIDE = "autograder.exercises.beside"
HEAVY = {"torch", "numpy", "coursekit"}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved (``from ..x import y`` → ``pkg.x.y`` and ``pkg.x``)."""
    name = module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def part_of(module: str) -> str | None:
    """The most specific part in MAY_IMPORT that holds ``module``."""
    matches = [p for p in MAY_IMPORT if module == p or module.startswith(p + ".")]
    return max(matches, key=len) if matches else None


def wrong_way_imports(root: Path = REPO) -> list[str]:
    problems = []
    for top in ("coursekit", "autograder", "bench", "hub"):
        for path in sorted((root / top).rglob("*.py")):
            here = part_of(module_name(path, root))
            for target in imports_of(path, root):
                if target.split(".")[0] not in OURS:
                    continue
                there = part_of(target)
                if target.split(".")[0] == "tests" or (there != here and there not in MAY_IMPORT[here]):
                    problems.append(f"{path.relative_to(root)} ({here}) imports {target} ({there})")
    return problems


def is_pure(module: str) -> bool:
    """The verdict side: everything of exercises/ outside beside/, but each exercise's observer."""
    if not module.startswith("autograder.exercises"):
        return False
    return not (module == BESIDE or module.startswith(BESIDE + ".")) and not module.endswith(".observe")


def torch_in_the_verdict(root: Path = REPO) -> list[str]:
    problems = []
    for path in sorted((root / "autograder" / "exercises").rglob("*.py")):
        module = module_name(path, root)
        if not is_pure(module):
            continue
        for target in imports_of(path, root):
            if target.split(".")[0] in HEAVY or (target.startswith("autograder.") and not is_pure(target)
                                                  and part_of(target) == "autograder.exercises"):
                problems.append(f"{path.relative_to(root)} imports {target}")
    return problems


def test_imports_point_one_way():
    assert wrong_way_imports() == []


def test_the_verdict_never_imports_torch():
    assert torch_in_the_verdict() == []


def test_a_planted_wrong_way_import_is_caught(tmp_path):
    """The checker itself works: a copy of the packages with one import the wrong way fails it."""
    for top in ("coursekit", "autograder", "bench", "hub"):
        shutil.copytree(REPO / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    assert wrong_way_imports(tmp_path) == [] and torch_in_the_verdict(tmp_path) == []
    checking = tmp_path / "autograder" / "exercises" / "judging" / "checking.py"
    checking.write_text(checking.read_text() + "\nfrom ...grader.batch import grade_class  # noqa\n")
    assert any("exercises/judging/checking.py" in p and "autograder.grader.batch" in p for p in wrong_way_imports(tmp_path))
    checks = tmp_path / "autograder" / "exercises" / "train_amp" / "checks.py"
    checks.write_text(checks.read_text() + "\nfrom .observe import devices  # noqa\n")
    assert any("train_amp/checks.py" in p for p in torch_in_the_verdict(tmp_path))


def test_the_class_graders_process_never_imports_torch():
    """Grading a class judges plain data: the grader's own process (CLI, batch, every exercise's checks) stays
    free of torch, which only the sandboxed workers import (also when it sets up a worker's environment)."""
    code = ("import sys, autograder.cli, autograder.grader.batch, autograder.grader.gradebook, "
            "autograder.authoring.studentkit\n"
            "from autograder.exercises import all_exercises\nall_exercises()\n"
            "from autograder.grader.sandbox import launch as sandbox\nsandbox._worker_env('/none'), sandbox._readonly_trees()\n"
            "print(sorted(m for m in ('torch', 'numpy', 'coursekit') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("package", ["coursekit", "autograder", "bench", "hub"])
def test_no_module_reaches_into_the_tests_by_path(package):
    """sys.path tricks bypass the import check above: no package names the tests folder in its code."""
    import re

    for path in (REPO / package).rglob("*.py"):
        assert not re.search(r"""/\s*["']tests["']|["']tests/""", path.read_text()), f"{path} names the tests folder"


@pytest.mark.parametrize("module", sorted(p.stem for p in (REPO / "bench").glob("*.py") if p.stem != "__init__"))
def test_every_bench_imports(module):
    """A bench is run by hand, rarely: a module it imports that moved must fail here, not on the day it is needed."""
    __import__(f"bench.{module}")


@pytest.mark.slow  # grades a student (about 20 s)
def test_one_submission_walks_the_grader_without_going_back(tmp_path):
    """Grading one student, every call from one grader module into another, traced: each stage the run goes
    through (reading, the references, grading, the reports) is entered once by the batch, and no module calls back
    into a module that called it (the run does not return to a module to finish a job it began there)."""
    import threading
    from collections import Counter

    from submission_factory import filled, reference_source, write

    from autograder.grader.batch import grade_class
    from autograder.grader.sandbox.launch import make_sandbox

    nb, ex = "01_gradient_accumulation.ipynb", "train_with_accumulation"
    write(tmp_path / "in", "ada", nb, filled(nb, {ex: reference_source(ex)}))
    calls = []

    def trace(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if event == "call" and caller != module and all(m.startswith("autograder.grader.") for m in (module, caller)) \
                and frame.f_code.co_name[0] != "<":  # a lambda or comprehension belongs to its caller's job
            calls.append((caller.rsplit(".", 1)[1], module.rsplit(".", 1)[1], frame.f_code.co_name))

    threading.setprofile(trace)
    sys.setprofile(trace)
    try:
        grade_class(tmp_path / "in", tmp_path / "out", make_sandbox(), jobs=1, progress=False)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    from_batch = Counter((callee, name) for caller, callee, name in calls if caller == "batch")
    assert max(from_batch.values()) == 1, from_batch
    stages = {callee for callee, _ in from_batch}
    assert {"submissions", "references", "grading", "report", "class_report", "outputs"} <= stages, stages
    # sandbox/launch.py starts the workers and calls back the policy it is given: not a stage of the walk
    edges = {(caller, callee) for caller, callee, _ in calls if "launch" not in (caller, callee)}
    assert not {(a, b) for a, b in edges if (b, a) in edges}, sorted(edges)


# Each folder of tests/ and the part of the repository its tests are about (a test file names what it checks; a
# new part of the code gets its folder here). Shared helpers and variants/ stay at the top, where every folder finds them.
TEST_FOLDERS = {"exercises": "autograder/exercises", "grader": "autograder/grader", "sandbox": "autograder/grader/sandbox",
                "authoring": "autograder/authoring", "notebooks": "solutions", "coursekit": "coursekit", "hub": "hub",
                "bench": "bench", "project": "."}


def test_the_tests_are_laid_out_like_the_code():
    assert not sorted(p.name for p in (REPO / "tests").glob("test_*.py")), "a test file belongs in a folder of TEST_FOLDERS"
    folders = {p.parent.name for p in (REPO / "tests").glob("*/test_*.py")}
    assert folders == set(TEST_FOLDERS), folders ^ set(TEST_FOLDERS)
    assert all((REPO / part).is_dir() for part in TEST_FOLDERS.values())
    names = [p.name for p in (REPO / "tests").rglob("test_*.py")]
    assert len(names) == len(set(names)), "test files need names unique across folders (pytest imports them by name)"
