"""A non-editable install (``pip install .``, a wheel) carries every file the grader reads at run time (issue 37):
the stubs the sandbox binds over the forbidden libraries above all (``stubs/empty`` was once left out, so a class
graded from a wheel could not switch them off)."""
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("autograder", "coursekit")


def build_wheel(tmp_path: Path) -> Path:
    """The wheel of a clean copy of the tracked files (a build in the checkout would leave build/ behind)."""
    source = tmp_path / "source"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((REPO / name).read_bytes())
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "wheel")], check=True, capture_output=True)
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    return wheel


def test_the_wheel_carries_every_package_file_and_the_sandbox_finds_its_stubs_there(tmp_path):
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        inside = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    tracked = subprocess.run(["git", "ls-files", *PACKAGES], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert not [name for name in tracked if name not in inside]
    # The installed grader, not this checkout: every file its forbidden-library binds name exists.
    found = subprocess.run(
        [sys.executable, "-c", "import autograder; from autograder.grader.sandbox import forbidden; "
         "s = forbidden.locate(); print(autograder.__file__); print('\\n'.join(sorted({a for a, _ in s.binds})))"],
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}, capture_output=True,
        text=True, check=True).stdout.split("\n")
    assert found[0].startswith(str(tmp_path / "site"))
    sources = [Path(line) for line in found[1:] if line]
    assert {p.name for p in sources} >= {"empty", "__init__.py", "stub-package"}
    assert all(p.exists() and str(p).startswith(str(tmp_path / "site")) for p in sources), sources
