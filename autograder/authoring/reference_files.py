"""Write and check the reference observations that ship to students, one file per exercise (instructor side).

``python -m autograder generate`` (which also writes the student notebooks) or ``python -m autograder references``
observes every reference solution of ``solutions/`` on the public scenarios the way the class grader does (a fresh
worker process) and writes ``autograder/references/<exercise>.json`` (format: ``selfcheck/recorded.py``).
``--check`` only compares fingerprints, so CI notices a solution, setup cell or exercise that changed without its
file being rebuilt. One file per exercise: a rebuild of one exercise cannot drop another's, and a reviewer reads
the diff of what changed (lists of numbers on one line each).
"""
import hashlib
import json
from importlib.metadata import version
from pathlib import Path

from ..selfcheck.recorded import FOLDER, FORMAT, canonical, checks_fingerprint, digest, reference_file
from .course import Course, NotebookSpec, load_course

REBUILD = "run `python -m autograder generate` (or just `references`) and commit autograder/references/"


def solution_fingerprint(spec: NotebookSpec, exercise: str) -> str:
    """Hash of what the reference observation is computed from: the notebook's setup cells and the solution cell."""
    return hashlib.sha256(canonical(spec.setup_code + [spec.reference_code[exercise]])).hexdigest()[:16]


def device_kind(observation: dict) -> str:
    """'cuda' when any scenario ran on a GPU (keys like 'name@cuda'), else 'cpu'."""
    return "cuda" if any(k.endswith("@cuda") for k in observation.get("scenarios", {})) else "cpu"


def readable_json(value, indent: int = 0) -> str:
    """JSON with objects one key a line and lists of plain values on one line: diffs a reviewer can read.

    Key order is kept: checks walk scenarios in observation order and their sentences name the first failing one,
    so a re-ordered file would give the same score in different words.
    """
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {readable_json(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        return "[\n" + ",\n".join(f"{inner}{readable_json(v, indent + 1)}" for v in value) + f"\n{pad}]"
    return json.dumps(value, separators=(", ", ": "), allow_nan=True)


def build_entry(course: Course, exercise: str, observation: dict) -> dict:
    spec = course.spec_for_exercise(exercise)
    entry = {"format": FORMAT, "exercise": exercise, "built_by": "python -m autograder references",
             "torch": version("torch"), "device": device_kind(observation),
             "solution": solution_fingerprint(spec, exercise), "checks": checks_fingerprint(exercise),
             "observation": observation}
    return {**entry, "digest": digest(entry)}


def write_references(observations: dict[str, dict], folder: Path = FOLDER) -> list[str]:
    """Write each exercise's file (observed on the public scenarios); remove files of exercises that are gone."""
    course = load_course()
    folder.mkdir(exist_ok=True)
    log = []
    for exercise, observation in observations.items():
        path = reference_file(exercise, folder)
        entry = build_entry(course, exercise, observation)
        text = readable_json(entry) + "\n"
        changed = not path.exists() or path.read_text() != text
        if changed and _same_but_measurements(path, entry):
            changed, text = False, path.read_text()  # a new run of the meters alone: keep the diff readable
        path.write_text(text)
        log.append(f"{'wrote' if changed else 'unchanged'} references/{path.name}: {len(text.encode()) / 1024:.0f} KiB, "
                   f"torch {version('torch')}, {device_kind(observation)}")
    for path in sorted(folder.glob("*.json")):
        if path.stem not in course.exercises:
            path.unlink()
            log.append(f"removed references/{path.name} (no such exercise in solutions/)")
    return log


def _without_meters(value):
    """What a second run of the same code must give again: not the meters' readings, and not the ranks' results of
    a scenario whose gates the launcher seeded with secrets drawn anew each run (it recomputes what they must be)."""
    if isinstance(value, dict):
        secret = isinstance(value.get("meter"), dict) and isinstance(value["meter"].get("gates"), dict) \
            and "expected" in value["meter"]["gates"]
        return {k: _without_meters(v) for k, v in value.items()
                if k not in ("meter", "digest") and not (secret and k == "ranks")}
    if isinstance(value, list):
        return [_without_meters(v) for v in value]
    return value


def _same_but_measurements(path: Path, entry: dict) -> bool:
    """The file at ``path`` says everything ``entry`` says except what the meters measured outside the ranks
    (bytes sent, memory held: a few percent apart between two runs, and compared with a margin)."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(old, dict) and old.get("digest") == digest(old) and _without_meters(old) == _without_meters(entry)


def stale_references(folder: Path = FOLDER, exercises: list[str] | None = None) -> list[str]:
    """Why the shipped files do not match solutions/ and the exercises' code (empty list: they do)."""
    course = load_course()
    problems = []
    for exercise in exercises or course.exercises:
        path = reference_file(exercise, folder)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            problems.append(f"references/{path.name} is missing or unreadable: {REBUILD}")
            continue
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("digest") != digest(data):
            problems.append(f"references/{path.name} has another format or was edited by hand: {REBUILD}")
        elif data.get("solution") != solution_fingerprint(course.spec_for_exercise(exercise), exercise):
            problems.append(f"the solution or setup cells of `{exercise}` changed since references/{path.name} was "
                            f"built: {REBUILD}")
        elif data.get("checks") != checks_fingerprint(exercise):
            problems.append(f"the code of `{exercise}` changed since references/{path.name} was built: {REBUILD}")
    extra = sorted(p.name for p in folder.glob("*.json") if p.stem not in course.exercises) if not exercises else []
    return problems + [f"references/{name} belongs to no exercise in solutions/: {REBUILD}" for name in extra]
