"""Finding who submitted what: a folder or an LMS zip download, matched to the course's notebooks.

Accepted layouts (folder or zip):

* ``<student>/<notebook>.ipynb`` (the CLI contract), also nested: ``<student>/<assignment>/<notebook>.ipynb``
  as nbgrader's ``submitted/`` folder has it;
* Moodle: ``<Full Name>_<id>_assignsubmission_file_/<notebook>.ipynb``;
* Canvas: flat files ``<student>_<...>_<notebook>.ipynb`` (``_LATE_`` and ``-1`` resubmission suffixes allowed).

A notebook under another name is matched by its graded cells, and the row says so.
"""
import hashlib
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .course import Course
from .notebook import NotebookProblem, graded_cell_ids, parse_notebook

MAX_FILE_BYTES = 50 << 20
MAX_ZIP_BYTES = 2 << 30


@dataclass
class Submission:
    student: str
    files: dict[str, bytes] = field(default_factory=dict)  # path inside the student's folder -> content

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + hashlib.sha256(self.files[name]).digest())
        return digest.hexdigest()


def _read_tree(path: Path) -> dict[str, bytes]:
    """Every *.ipynb below ``path`` (relative POSIX path -> bytes), checkpoints skipped."""
    if path.is_file() and zipfile.is_zipfile(path):
        return _read_zip(path)
    files = {}
    for file in sorted(path.rglob("*")):
        rel = file.relative_to(path)
        if file.is_file() and file.suffix == ".ipynb" and ".ipynb_checkpoints" not in rel.parts:
            files[rel.as_posix()] = file.read_bytes() if file.stat().st_size <= MAX_FILE_BYTES else b"\0too large"
    return files


def _read_zip(path: Path) -> dict[str, bytes]:
    files, total = {}, 0
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = PurePosixPath(info.filename)
            if info.is_dir() or name.suffix != ".ipynb" or ".ipynb_checkpoints" in name.parts \
                    or name.is_absolute() or ".." in name.parts or "__MACOSX" in name.parts:
                continue
            total += info.file_size
            if total > MAX_ZIP_BYTES:
                raise ValueError(f"{path} unpacks to more than {MAX_ZIP_BYTES >> 30} GB; refusing to read it")
            files[name.as_posix()] = archive.read(info) if info.file_size <= MAX_FILE_BYTES else b"\0too large"
    if len({p.split("/")[0] for p in files}) == 1 and all("/" in p for p in files):
        prefix = next(iter(files)).split("/")[0] + "/"  # a zip of one folder that holds the students
        files = {p[len(prefix):]: data for p, data in files.items()}
    return files


def _student_of_folder(name: str) -> str:
    return name.split("_assignsubmission_")[0]  # Moodle folder names; anything else unchanged


def discover(path: Path, course: Course) -> list[Submission]:
    """Group the submitted notebooks by student."""
    students: dict[str, Submission] = {}
    known = sorted(course.notebooks, key=len, reverse=True)
    for rel, data in _read_tree(Path(path)).items():
        parts = rel.split("/")
        if len(parts) > 1:
            student, inner = _student_of_folder(parts[0]), "/".join(parts[1:])
        else:  # Canvas: the student is the first token, the notebook name is at the end
            base = re.sub(r"-\d+(?=\.ipynb$)", "", parts[0])
            owner = next((base[: -len(n)].rstrip("_") for n in known if base.endswith("_" + n)), None)
            student, inner = (owner.split("_")[0], base[len(owner) + 1:]) if owner else (Path(base).stem, parts[0])
        students.setdefault(student, Submission(student)).files[inner] = data
    return [students[s] for s in sorted(students)]


def match_notebooks(submission: Submission, course: Course, wanted: list[str]) -> dict[str, tuple[str | None, str]]:
    """For each wanted notebook: (path in the submission or None, a note for the student)."""
    by_base = {}
    for rel in submission.files:
        by_base.setdefault(re.sub(r"-\d+(?=\.ipynb$)", "", PurePosixPath(rel).name), []).append(rel)
    matched: dict[str, tuple[str | None, str]] = {}
    used = set()
    for name in wanted:
        candidates = sorted(by_base.get(name, []))
        if candidates:
            matched[name] = (candidates[0], "")
            used.add(candidates[0])
    for name in wanted:
        if name in matched:
            continue
        exercises = set(course.notebooks[name].exercises)
        for rel in sorted(set(submission.files) - used):
            try:
                ids = graded_cell_ids(parse_notebook(submission.files[rel]))
            except NotebookProblem:
                continue
            if exercises & ids:
                matched[name] = (rel, f"(Graded `{rel}` as {name}: please keep the released file name.) ")
                used.add(rel)
                break
        else:
            others = sorted(set(submission.files) - used)
            hint = f" Found instead: {', '.join(others)}." if others else ""
            matched[name] = (None, f"No notebook {name} was submitted.{hint}")
    return matched
