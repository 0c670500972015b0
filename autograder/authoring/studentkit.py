"""Build the student kit: the course as students receive it, with self-checks and without a line of the answers.

``python -m autograder student-kit --out dist/student-kit`` (``make student-kit``) writes

    dist/student-kit/training_at_scale_student-<version>-py3-none-any.whl   # pip install this
    dist/student-kit/environment.yml                                        # or: conda env create -f it
    dist/student-kit/README.md                                              # the student README
    dist/training-at-scale-student-<version>.zip                            # the folder, for an LMS

The wheel holds the released notebooks (``notebooks/``), ``coursekit``, the parts of ``autograder`` declared in
``KIT`` (the exercises, the self-check and the reference observations: never the grader or these authoring tools),
the ``training-at-scale`` launcher, and Jupyter settings that hide nbgrader's instructor tools. Before anything is
written, every file is searched for the solution cells of ``solutions/``; a kit that would leak is not built.
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

from .course import load_course
from .reference_files import stale_references

PROJECT = "training-at-scale-student"
INSTRUCTOR_ONLY_DEPENDENCIES = {"distributed"}  # the class grader's cluster back end
KIT_SOURCES = Path(__file__).resolve().parents[2] / "studentkit"   # launcher, README, Jupyter settings
JUPYTER_SETTINGS = {  # installed under the environment's etc/ and share/ (read by every JupyterLab started in it)
    "etc/jupyter/labconfig/page_config.d": "jupyter-config/labconfig/page_config.d/training-at-scale-student.json",
    "etc/jupyter/jupyter_server_config.d": "jupyter-config/jupyter_server_config.d/training-at-scale-student.json",
    "etc/jupyter": "jupyter-config/nbgrader_config.json",
    # Lab's defaults: no "get notified about Jupyter news?" pop-up over the start page, no update check
    "share/jupyter/lab/settings/overrides.d": "jupyter-config/lab-settings/overrides.d/training-at-scale-student.json",
}
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "BEGIN HIDDEN TESTS")
# What of ``autograder`` ships: the package's entry (``check``), the exercises (their observers run in the
# student's kernel), the self-check, and the reference observations it compares with.
KIT = ("autograder/__init__.py", "autograder/exercises", "autograder/selfcheck", "autograder/references")


# ---- what goes in --------------------------------------------------------------------------

def package_root() -> Path:
    return Path(__file__).resolve().parents[2]


def student_files() -> list[Path]:
    """The files of ``autograder`` that ship, as declared in ``KIT``: every Python file and data file in them."""
    root = package_root()
    files = []
    for part in KIT:
        path = root / part
        files += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".py", ".json")
                        and "__pycache__" not in p.parts) if path.is_dir() else [path]
    return files


def student_packages() -> list[str]:
    """The Python packages among the shipped files (what the kit's pyproject lists)."""
    return sorted({".".join(p.relative_to(package_root()).parent.parts) for p in student_files()
                   if p.name == "__init__.py"})


def student_dependencies() -> list[str]:
    project = tomllib.loads((package_root() / "pyproject.toml").read_text())["project"]
    return [d for d in project["dependencies"] if Requirement(d).name not in INSTRUCTOR_ONLY_DEPENDENCIES]


def project_version() -> str:
    return tomllib.loads((package_root() / "pyproject.toml").read_text())["project"]["version"]


def _pyproject(version: str) -> str:
    deps = "".join(f"    {json.dumps(d)},\n" for d in student_dependencies())
    packages = json.dumps(student_packages() + ["coursekit", "training_at_scale_student"])
    data_files = "".join(f'"{target}" = ["{source}"]\n' for target, source in JUPYTER_SETTINGS.items())
    return f'''[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{PROJECT}"
version = "{version}"
description = "Training at Scale, the student kit: lessons, helpers and self-checks (no solutions)."
readme = "README.md"
requires-python = ">=3.11"
license = "MIT"
dependencies = [
{deps}]

[project.scripts]
training-at-scale = "training_at_scale_student.launcher:main"

[tool.setuptools]
packages = {packages}

[tool.setuptools.package-data]
autograder = ["references/*.json"]
coursekit = ["results/*.json", "results/*.md"]
training_at_scale_student = ["course/**/*"]

[tool.setuptools.data-files]
{data_files}'''


def stage(project: Path) -> None:
    """Lay out the kit's source tree under ``project``."""
    root = package_root()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    for path in student_files():
        dest = project / path.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    shutil.copytree(root / "coursekit", project / "coursekit", ignore=ignore)
    shutil.copytree(KIT_SOURCES / "training_at_scale_student", project / "training_at_scale_student", ignore=ignore)
    shutil.copytree(root / "notebooks", project / "training_at_scale_student" / "course", ignore=ignore)
    shutil.copytree(KIT_SOURCES / "jupyter-config", project / "jupyter-config")
    shutil.copyfile(KIT_SOURCES / "README.md", project / "README.md")
    (project / "pyproject.toml").write_text(_pyproject(project_version()))


def _build_wheel(project: Path, out: Path) -> Path:
    env = {**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", "1764806400")}  # same bytes twice
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "--wheel-dir", str(out), str(project)], capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"building the student wheel failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    (wheel,) = out.glob("*.whl")
    return wheel


def _environment_yml(wheel: str) -> str:
    return ("# conda env create -f environment.yml && conda activate training-at-scale\n"
            "# then: training-at-scale lab\n"
            "name: training-at-scale\nchannels:\n  - conda-forge\ndependencies:\n  - python=3.11\n  - pip\n"
            f"  - pip:\n      - ./{wheel}\n")


# ---- what must not go in ---------------------------------------------------------------------

def _code_lines(text: str) -> list[str]:
    """Lines of code, stripped, without blank lines and comments: what a copied solution keeps."""
    lines = (line.split("  #")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def solution_bodies() -> dict[str, list[str]]:
    """exercise -> the code lines between the solution markers of its instructor cell."""
    bodies = {}
    for spec in load_course().notebooks.values():
        for exercise, source in spec.reference_code.items():
            # every region: a class exercise has one per method (ShardedOptimizer), not only the first
            regions = [part.split("### END SOLUTION", 1)[0] for part in source.split("### BEGIN SOLUTION")[1:]]
            bodies[exercise] = _code_lines("\n".join(regions or [source]))
    return bodies


def _texts(name: str, data: bytes, depth: int = 0):
    """(path, text) for every text file in ``data``, looking inside wheels, zips and notebooks."""
    if zipfile.is_zipfile(io.BytesIO(data)) and depth < 3:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for info in archive.infolist():
                if not info.is_dir():
                    yield from _texts(f"{name}!{info.filename}", archive.read(info), depth + 1)
        return
    text = data.decode("utf-8", errors="replace")
    if name.endswith(".ipynb"):
        try:
            text = "\n".join("".join(c.get("source", "")) for c in json.loads(text)["cells"])
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
    yield name, text


def _contains_run(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


CATALOGUES = ("mistakes.py", "localise.py", "feedback.py", "diagnosis.py")  # the texts feedback is made of


def _statement(line: str) -> bool:
    """A solution line a student could paste: a long one, or a block's header (for/with/if ...:), not an API name
    the lesson teaches in prose (``optimizer.step()``)."""
    return len(line) >= 24 or (line.endswith(":") and line.split(" ", 1)[0] in ("for", "with", "if", "while", "def"))


def catalogue_leaks(name: str, text: str, bodies: dict[str, list[str]]) -> list[str]:
    """A catalogue of mistakes (and its localisation declaration) ships with the kit and is read without making the
    mistake: no single line of a solution may appear in it, not even inside a fix's sentence."""
    if not name.endswith(CATALOGUES):
        return []
    return [f"{name}: quotes a line of the solution of `{exercise}`: {line!r}"
            for exercise, lines in bodies.items() for line in dict.fromkeys(lines) if _statement(line) and line in text]


def find_leaks(folder: Path, window: int = 4) -> list[str]:
    """Every place under ``folder`` (archives unpacked) holding solution code, a solution marker or an
    instructor-only file. Solution code counts as found when any ``window`` consecutive code lines of a solution
    (the whole body if it is shorter) appear in a file, in order. Four, not three: Lesson 2 rightly teaches
    GradScaler's three-line idiom (scale(loss).backward(), step, update) that every AMP loop contains. A catalogue of
    mistakes may not hold even one line (``catalogue_leaks``)."""
    bodies = solution_bodies()
    needles = {ex: [body[i:i + window] for i in range(max(1, len(body) - window + 1))] for ex, body in bodies.items()}
    problems = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        for name, text in _texts(str(path.relative_to(folder)), path.read_bytes()):
            parts = set(Path(name.replace("!", "/")).parts)
            if parts & {"solutions", "tests", "variants", "bench"} or name.endswith((".db", "nbgrader_config.py")):
                problems.append(f"{name}: an instructor-only file")
            for marker in SOLUTION_MARKERS:
                if marker in text:
                    problems.append(f"{name}: contains the marker {marker!r}")
            problems += catalogue_leaks(name, text, bodies)
            lines = _code_lines(text)
            for exercise, runs in needles.items():
                if any(run and _contains_run(lines, run) for run in runs):
                    problems.append(f"{name}: contains solution code of `{exercise}`")
    return problems


# ---- the command -------------------------------------------------------------------------------

def build_student_kit(out: Path) -> list[str]:
    stale = stale_references()
    if stale:
        raise RuntimeError("the reference observations are out of date, so the kit's self-checks would be wrong:\n"
                           + "\n".join(stale))
    out = out.resolve()
    version = project_version()
    with tempfile.TemporaryDirectory(prefix="student-kit-") as tmp:
        project, folder = Path(tmp) / "project", Path(tmp) / f"{PROJECT}-{version}"
        stage(project)
        folder.mkdir()
        wheel = _build_wheel(project, folder)
        shutil.copyfile(KIT_SOURCES / "README.md", folder / "README.md")
        (folder / "environment.yml").write_text(_environment_yml(wheel.name))
        leaks = find_leaks(folder)
        if leaks:
            raise RuntimeError("the student kit would leak instructor material; nothing was written:\n"
                               + "\n".join(leaks))
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(folder, out)
        archive = out.parent / f"{PROJECT}-{version}.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(folder.rglob("*")):
                info = zipfile.ZipInfo(str(path.relative_to(folder.parent)), date_time=(2025, 12, 4, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, path.read_bytes())
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return [f"built {out} ({size / 1024:.0f} KiB): {wheel.name}, environment.yml, README.md",
            f"built {archive} ({archive.stat().st_size / 1024:.0f} KiB), the same folder zipped for an LMS",
            "searched every file (archives unpacked) for solution code and instructor files: none found"]
