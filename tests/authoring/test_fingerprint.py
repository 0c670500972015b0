"""One fingerprint of the grader's code (autograder/selfcheck/fingerprint.py), planted edits in a copy of the repository.

* an edit to any exercise's ``checks.py`` (or its catalogue, or the report) makes a resumed grading run grade again;
* an edit to a shared exercise module such as ``meter.py`` makes ``generate --check`` fail until the shipped
  references are rebuilt; an edit to a catalogue (wording only) does not.
"""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION = ("from autograder.grader.batch import _grader_version; from autograder.grader.sandbox.launch import Sandbox, "
           "Limits; print(_grader_version({}, Sandbox('off', Limits(), None), None))")


def copy_of_repo(target: Path) -> Path:
    """The repository's code and course, without the environment or git."""
    ignore = shutil.ignore_patterns("__pycache__", ".venv", ".git", "*.egg-info", "dist", "build")
    for part in ("autograder", "coursekit", "solutions", "notebooks", "classroom", "studentkit"):
        shutil.copytree(REPO / part, target / part, ignore=ignore)
    for name in ("README.md", "pyproject.toml"):
        shutil.copy(REPO / name, target / name)
    return target


@pytest.fixture
def copy(tmp_path):
    return copy_of_repo(tmp_path / "repo")


@pytest.fixture(scope="module")
def versioned(tmp_path_factory):
    """One copy for every planted edit (each test undoes its own), and its grader version before any edit: the same
    when asked twice (the same code, the same version: saved rows are resumed)."""
    copy = copy_of_repo(tmp_path_factory.mktemp("versioned") / "repo")
    before = grader_version(copy)
    assert grader_version(copy) == before
    return copy, before


def run(copy: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=copy, capture_output=True, text=True, timeout=300,
                          env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(copy), "HOME": str(copy)})


def grader_version(copy: Path) -> str:
    answer = run(copy, "-c", VERSION)
    assert answer.returncode == 0, answer.stderr
    return answer.stdout.strip()


def append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


@pytest.mark.parametrize("edited", ["exercises/train_amp/checks.py", "exercises/ring_attention/mistakes.py",
                                    "exercises/judging/feedback.py", "grader/class_report.html.j2"])
def test_an_edit_anywhere_in_the_grader_makes_a_resumed_run_grade_again(versioned, edited):
    copy, before = versioned
    path = copy / "autograder" / edited
    original = path.read_text()
    try:
        append(path, "# a planted edit" if edited.endswith(".py") else "{# a planted edit #}")
        assert grader_version(copy) != before
    finally:
        path.write_text(original)


def test_an_edit_to_the_meter_makes_generate_check_fail_and_a_catalogue_edit_does_not(copy):
    """(The copy with only the catalogue edit passing is also the control: the copy's references check clean.
    That control asks `references --check`, the part of `generate --check` that reads the fingerprint: the other
    parts regenerate every student notebook from solutions/, which no edit here touches, at ~10 CPU-s a run.)"""
    append(copy / "autograder" / "exercises" / "ring_attention" / "mistakes.py", "# wording only")
    check = run(copy, "-m", "autograder", "references", "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    append(copy / "autograder" / "exercises" / "beside" / "meter.py", "# a planted edit")
    check = run(copy, "-m", "autograder", "generate", "--check")
    assert check.returncode != 0
    assert "the code of `BucketedDDP` changed" in check.stdout + check.stderr


def test_generate_keeps_a_reference_file_whose_new_run_differs_only_by_measurements_and_secrets(tmp_path):
    """A second observation of unchanged code differs in what the meters read and, in a scenario whose gates the
    launcher seeds with per-run secrets, in the ranks' results: the file is kept as it was (no churn, no conflicts);
    any other difference rewrites it."""
    import json

    from autograder.authoring.reference_files import write_references
    from autograder.selfcheck.recorded import FOLDER

    shutil.copy(FOLDER / "BucketedDDP.json", tmp_path / "BucketedDDP.json")
    shipped = (tmp_path / "BucketedDDP.json").read_text()
    observation = json.loads(shipped)["observation"]
    gated = next(s for s in observation["scenarios"].values() if "expected" in s.get("meter", {}).get("gates", {}))
    gated["ranks"][0]["grads"][0][0] += 1.0       # made from the launcher's secret seeds
    gated["meter"]["peak_bytes"][0] += 4096       # a meter's reading
    assert write_references({"BucketedDDP": observation}, tmp_path)[0].startswith("unchanged")
    assert (tmp_path / "BucketedDDP.json").read_text() == shipped
    observation["scenarios"]["one_bucket"]["ranks"][0]["final"] = [0.5]  # a result that is not secret
    assert write_references({"BucketedDDP": observation}, tmp_path)[0].startswith("wrote")
