"""Finding who submitted what: a folder or an LMS zip download, matched to the course's notebooks.

Accepted layouts (folder or zip):

* ``<student>/<notebook>.ipynb`` (the CLI contract), also nested: ``<student>/<assignment>/<notebook>.ipynb``
  as nbgrader's ``submitted/`` folder has it;
* Moodle: ``<Full Name>_<participant id>_assignsubmission_file_/<notebook>.ipynb`` (folders, the default
  since Moodle 3.1) or the same prefix on flat files; the participant id is the student's key;
* Canvas: flat files ``<lastfirst>[_LATE]_<user id>_<submission id>_<notebook>.ipynb`` (a ``-1`` resubmission
  suffix allowed); the Canvas user id is the student's key, ``lastfirst`` the readable name.

Students are told apart by their key (never merged by name); a zip holding one folder is one student, unless
that folder holds the students. Only regular files are read: a symbolic link, a FIFO or a device (in a folder
or in a zip) is refused with a reason on that student's row, never followed or opened. A notebook under
another name is matched by its graded cells, and the row says so.
"""
import hashlib
import os
import re
import stat
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..authoring.course import Course
from .notebook import Notebook, NotebookProblem, graded_cell_ids, parse_notebook

MAX_FILE_BYTES = 20 << 20           # a lesson notebook with its outputs is a few MB
MAX_ZIP_BYTES = 2 << 30
NOTEBOOKS_PER_LESSON = 3             # copies and renamed versions a student may hand in
CANVAS = re.compile(r"^(?P<name>[^_/]+?)(?:_LATE)?_(?P<user>\d+)_(?P<submission>\d+)_(?P<file>.+)$")
MOODLE = re.compile(r"^(?P<name>.*?)_(?P<user>\d+)_assignsubmission_[a-z]+_(?P<file>.*)$")
RESUBMITTED = re.compile(r"-\d+(?=\.ipynb$)")


class SubmissionsError(Exception):
    """The submissions as a whole cannot be read (the instructor's problem, not a student's)."""


@dataclass(frozen=True)
class Refused:
    """A submitted path the grader will not read; the reason is for the student."""
    reason: str


@dataclass(frozen=True)
class Received:
    """A submitted notebook as the grader keeps it: the digest of its bytes and its typed cells (or why they cannot
    be read). The bytes themselves are dropped as soon as they are parsed: the grader holds a few small typed
    notebooks per student, never the uploads (outputs, images), whatever their size."""
    digest: bytes
    parsed: Notebook | NotebookProblem


def received(data: bytes) -> Received:
    try:
        parsed = parse_notebook(data)
    except NotebookProblem as problem:
        parsed = problem
    return Received(hashlib.sha256(data).digest(), parsed)


@dataclass
class Submission:
    student: str                                        # unique key: LMS user id, or the folder name
    name: str = ""                                      # readable name (from the LMS file names)
    files: dict[str, Received | Refused] = field(default_factory=dict)  # path inside the student's folder

    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.student.encode("utf-8", "surrogateescape") + b"\0")
        for name in sorted(self.files):
            data = self.files[name]
            content = data.digest if isinstance(data, Received) else hashlib.sha256(b"refused\0" + data.reason.encode()).digest()
            digest.update(name.encode("utf-8", "surrogateescape") + b"\0" + content)
        return digest.hexdigest()

    def notebook(self, path: str) -> Notebook:
        """The typed notebook at ``path``, or NotebookProblem."""
        data = self.files[path]
        result = data.parsed if isinstance(data, Received) else NotebookProblem(data.reason)
        if isinstance(result, NotebookProblem):
            raise result
        return result


def _refused_link(rel: str) -> Refused:
    return Refused(f"`{rel}` is a symbolic link, not a file; the grader reads only files. Upload the notebook "
                   "file itself.")


def _refused_special(rel: str) -> Refused:
    return Refused(f"`{rel}` is not a regular file (a pipe, socket or device); upload the notebook file itself.")


def _too_large(rel: str) -> Refused:
    return Refused(f"`{rel}` is larger than {MAX_FILE_BYTES >> 20} MB; clear the outputs and submit again.")


def _read_regular(path: str, rel: str) -> Received | Refused:
    """Read a file without following a link or blocking on a FIFO; re-check the type on the open file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return _refused_link(rel) if os.path.islink(path) else Refused(f"`{rel}` could not be read.")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return _refused_special(rel)
        if info.st_size > MAX_FILE_BYTES:
            return _too_large(rel)
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > MAX_FILE_BYTES:
                return _too_large(rel)
            chunks.append(chunk)
        return received(b"".join(chunks))
    finally:
        os.close(fd)


def _read_folder(root: Path) -> dict[str, Received | Refused]:
    """Every *.ipynb below ``root`` (relative POSIX path -> typed or Refused); links are refused, never followed."""
    files: dict[str, Received | Refused] = {}
    for folder, dirs, names in os.walk(root):  # os.walk does not descend into linked folders
        rel_folder = Path(folder).relative_to(root)
        for d in sorted(dirs):
            if d == ".ipynb_checkpoints" or d == "__MACOSX":
                dirs.remove(d)
            elif os.path.islink(os.path.join(folder, d)):
                files[(rel_folder / d).as_posix()] = _refused_link((rel_folder / d).as_posix())
        for name in sorted(names):
            path, rel = os.path.join(folder, name), (rel_folder / name).as_posix()
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                files[rel] = _refused_link(rel)
            elif name.endswith(".ipynb"):
                files[rel] = _read_regular(path, rel) if stat.S_ISREG(mode) else _refused_special(rel)
    return files


def _read_zip(path: Path) -> dict[str, Received | Refused]:
    files: dict[str, Received | Refused] = {}
    total = 0
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SubmissionsError(f"{path} is not a readable zip file ({exc})") from None
    with archive:
        for info in archive.infolist():
            name = PurePosixPath(info.filename)
            if info.is_dir() or "\\" in info.filename or name.is_absolute() or ".." in name.parts \
                    or ".ipynb_checkpoints" in name.parts or "__MACOSX" in name.parts:
                continue
            rel, mode = name.as_posix(), info.external_attr >> 16
            if stat.S_ISLNK(mode):
                files[rel] = _refused_link(rel)
                continue
            if name.suffix != ".ipynb":
                continue
            if stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # writers that set no type bits mean a file
                files[rel] = _refused_special(rel)
                continue
            total += info.file_size
            if total > MAX_ZIP_BYTES:
                raise SubmissionsError(f"{path} unpacks to more than {MAX_ZIP_BYTES >> 30} GB; refusing to read it")
            if info.file_size > MAX_FILE_BYTES:
                files[rel] = _too_large(rel)
                continue
            try:
                files[rel] = received(archive.read(info))
            except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, EOFError, OSError):
                files[rel] = Refused(f"`{rel}` could not be unpacked from the zip (damaged or encrypted).")
    return _strip_wrapper_folder(files)


def _strip_wrapper_folder(files: dict) -> dict:
    """A zip of one folder that *holds* the students (``download/<student>/...`` or ``download/<canvas files>``)
    is unwrapped; a zip of one student's folder (Moodle's ``Name_id_assignsubmission_file_/``) is not."""
    tops = {p.split("/")[0] for p in files}
    if len(tops) != 1 or not all("/" in p for p in files):
        return files
    top = next(iter(tops))
    inner = {p[len(top) + 1:]: data for p, data in files.items()}
    holds_students = all("/" in p or CANVAS.match(p) or MOODLE.match(p) for p in inner)
    if MOODLE.match(top) or not holds_students:
        return files
    return inner


def _identity(rel: str, known: list[str]) -> tuple[str, str, str]:
    """(student key, readable name, path inside the student's folder) for one submitted path."""
    parts = rel.split("/")
    if len(parts) > 1:
        folder, inner = parts[0], "/".join(parts[1:])
        moodle = MOODLE.match(folder)
        if moodle and moodle["file"] == "":
            return moodle["user"], moodle["name"], inner
        return folder, folder, inner
    base = parts[0]
    for pattern in (MOODLE, CANVAS):
        found = pattern.match(base)
        if found and found["file"]:
            return found["user"], found["name"], found["file"]
    plain = RESUBMITTED.sub("", base)
    owner = next((plain[: -len(n) - 1] for n in known if plain.endswith("_" + n) and len(plain) > len(n) + 1), None)
    if owner:
        return owner, owner, base[len(owner) + 1:]
    return Path(base).stem, Path(base).stem, base


def discover(path: Path, course: Course) -> list[Submission]:
    """Group the submitted notebooks by student (by key: two students never share a row)."""
    path = Path(path)
    files = _read_zip(path) if path.is_file() else _read_folder(path)
    known = sorted(course.notebooks, key=len, reverse=True)
    grouped: dict[tuple[str, str], dict] = {}
    for rel, data in files.items():
        key, name, inner = _identity(rel, known)
        grouped.setdefault((key, name), {})[inner] = data
    if path.is_dir():  # a student folder without a notebook (collected, but the notebook was deleted) keeps its row
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False) and entry.name not in (".ipynb_checkpoints", "__MACOSX"):
                key, name, _ = _identity(entry.name + "/-", known)
                if not any(k == key for k, _ in grouped):
                    grouped[(key, name)] = {}
    names_per_key: dict[str, int] = {}
    for key, _ in grouped:
        names_per_key[key] = names_per_key.get(key, 0) + 1
    most = NOTEBOOKS_PER_LESSON * len(course.notebooks)
    for content in grouped.values():  # what one student can make the grader hold is bounded too
        for extra in sorted(content)[most:]:
            content[extra] = Refused(f"`{extra}` was not read: the submission holds more than {most} notebooks.")
    submissions = [Submission(key if names_per_key[key] == 1 else f"{key} ({name})", name, content)
                   for (key, name), content in grouped.items()]
    return sorted(submissions, key=lambda s: s.student)


def _base_name(rel: str) -> str:
    return RESUBMITTED.sub("", PurePosixPath(rel).name)


def match_notebooks(submission: Submission, course: Course, wanted: list[str]) -> dict[str, tuple[str | None, str]]:
    """For each wanted notebook: (path in the submission or None, a note for the student)."""
    by_base: dict[str, list[str]] = {}
    for rel in submission.files:
        by_base.setdefault(_base_name(rel), []).append(rel)
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
                ids = graded_cell_ids(submission.notebook(rel))
            except NotebookProblem:
                continue
            if exercises & ids:
                matched[name] = (rel, f"(Graded `{rel}` as {name}: please keep the released file name.) ")
                used.add(rel)
                break
        else:
            others = sorted(set(submission.files) - used)
            described = [f"{o} ({submission.files[o].reason})" if isinstance(submission.files[o], Refused) else o
                         for o in others]
            hint = f" Found instead: {', '.join(described)}." if others else ""
            matched[name] = (None, f"No notebook {name} was submitted.{hint}")
    return matched


def submitted_notebooks(submission: Submission, course: Course) -> set[str]:
    """The course notebooks this student submitted (by file name, or recognised by its graded cells)."""
    return {name for name, (path, _) in match_notebooks(submission, course, list(course.notebooks)).items() if path}
