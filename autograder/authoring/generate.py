"""Student notebooks from instructor notebooks, with nbgrader's own ``generate_assignment``.

``solutions/<lesson>/*.ipynb`` → ``notebooks/<lesson>/*.ipynb`` (solutions cut at the ``### BEGIN/END
SOLUTION`` markers, outputs cleared, cells locked and check-summed), and the ungraded notebooks at the
top of ``solutions/`` (the start page) copied without outputs. ``check_generated`` generates into a temporary
folder and compares, which is what CI runs (the CLI's ``generate`` also rebuilds the reference observations).
"""
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .course import course_root, nbgrader_config


def _nbgrader_api(release: Path, db: Path):
    # nbgrader runs `alembic` for its database: make this interpreter's scripts findable even when the
    # virtual environment is not activated.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    from nbgrader.apps import NbGraderAPI
    from traitlets.config import Config

    config = nbgrader_config()
    overrides = Config()
    overrides.CourseDirectory.release_directory = str(release)
    overrides.CourseDirectory.source_directory = str(course_root() / "solutions")
    overrides.CourseDirectory.db_url = f"sqlite:///{db}"
    config.merge(overrides)
    return NbGraderAPI(config=config)


def clear_outputs(path: Path) -> bool:
    """Remove outputs and execution counts in place; True if the file changed."""
    text = path.read_text()
    nb = json.loads(text)
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    new = json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"  # nbformat's layout
    if new != text:
        path.write_text(new)
        return True
    return False


def _assignments(solutions: Path) -> list[str]:
    return sorted(p.name for p in solutions.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def generate_into(release: Path) -> list[str]:
    """Generate every student notebook under ``release``; returns a log line per assignment."""
    solutions = course_root() / "solutions"
    log = []
    with tempfile.TemporaryDirectory() as tmp:
        api = _nbgrader_api(release, Path(tmp) / "gradebook.db")
        for assignment in _assignments(solutions):
            result = api.generate_assignment(assignment, force=True, create=True)
            if not result["success"]:
                raise RuntimeError(f"nbgrader could not generate {assignment}:\n{result['log']}\n{result['error']}")
            log.append(f"generated notebooks/{assignment}")
    for page in sorted(solutions.glob("*.ipynb")):  # ungraded pages, e.g. the start page
        shutil.copyfile(page, release / page.name)
        clear_outputs(release / page.name)
        log.append(f"copied notebooks/{page.name}")
    for nb in release.rglob("*.ipynb"):
        clear_outputs(nb)  # one JSON layout for every file, whichever tool wrote it
    return log


def generate() -> list[str]:
    """Regenerate notebooks/; it is replaced only once the whole generation succeeded."""
    root = course_root()
    log = [f"cleared outputs of {p.relative_to(root)}" for p in sorted((root / "solutions").rglob("*.ipynb"))
           if ".ipynb_checkpoints" not in p.parts and clear_outputs(p)]
    release = root / "notebooks"
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        fresh = Path(tmp) / "notebooks"
        fresh.mkdir()
        log += generate_into(fresh)
        if release.exists():
            release.rename(Path(tmp) / "old")
        fresh.rename(release)
    return log


def _tracked(path: Path) -> bool:
    """Files that belong in notebooks/ (not caches that running a lesson's scripts leaves behind)."""
    return path.is_file() and not {".ipynb_checkpoints", "__pycache__"} & set(path.parts)


def check_generated() -> list[str]:
    """Problems that make the committed notebooks differ from a fresh generation (empty list: none)."""
    root = course_root()
    problems = [f"{p.relative_to(root)} has outputs: run `python -m autograder generate` (it clears them)"
                for p in sorted((root / "solutions").rglob("*.ipynb"))
                if any(c.get("outputs") for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "code")]
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "notebooks"
        fresh.mkdir()
        generate_into(fresh)
        want = {p.relative_to(fresh): p.read_bytes() for p in fresh.rglob("*") if _tracked(p)}
    committed = root / "notebooks"
    have = {p.relative_to(committed): p.read_bytes() for p in committed.rglob("*") if _tracked(p)}
    for rel in sorted(set(want) | set(have)):
        if rel not in have:
            problems.append(f"notebooks/{rel} is missing: run `python -m autograder generate`")
        elif rel not in want:
            problems.append(f"notebooks/{rel} has no source in solutions/: delete it or run `python -m autograder generate`")
        elif want[rel] != have[rel]:
            problems.append(f"notebooks/{rel} differs from what solutions/ generates: run `python -m autograder generate`")
    return problems
