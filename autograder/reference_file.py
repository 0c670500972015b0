"""Write and check ``reference_observations.json``, the reference results that ship to students (instructor side).

``python -m autograder generate`` (which also writes the student notebooks) or ``python -m autograder references``
(this file only) observes every reference solution of ``solutions/`` on the public scenarios the way the class
grader does (a fresh worker process, one thread) and writes the file; ``generate --check`` and ``references --check``
only compare fingerprints, so CI notices a solution, setup cell or check that changed without the file being rebuilt.
"""
import hashlib
import json
from importlib.metadata import version
from pathlib import Path

from .course import Course, NotebookSpec, load_course
from .observations import FILE, FORMAT, canonical, checks_fingerprint, digest


def solution_fingerprint(spec: NotebookSpec, exercise: str) -> str:
    """Hash of what the reference observation is computed from: the notebook's setup cells and the solution cell."""
    return hashlib.sha256(canonical(spec.setup_code + [spec.reference_code[exercise]])).hexdigest()[:16]


def observe_public(course: Course) -> dict[str, dict]:
    """Every exercise's reference observation on the public scenarios, observed in a worker like class grading's."""
    from .grading import reference_observations
    from .sandbox import make_sandbox

    # Trusted code (the solutions), so no isolation, but the same fresh single-threaded worker as class grading.
    return reference_observations(course, course.exercises, make_sandbox(enabled=False), salt=0)


def device_kind(observations: dict[str, dict]) -> str:
    """'cuda' when any scenario ran on a GPU (keys like 'name@cuda'), else 'cpu'."""
    keys = (k for o in observations.values() for k in o.get("scenarios", {}))
    return "cuda" if any(k.endswith("@cuda") for k in keys) else "cpu"


def build_file(course: Course, observations: dict[str, dict]) -> str:
    device, torch_version = device_kind(observations), version("torch")
    exercises = {}
    for exercise in course.exercises:
        spec = course.spec_for_exercise(exercise)
        exercises[exercise] = {"observation": observations[exercise], "torch": torch_version, "device": device,
                               "solution": solution_fingerprint(spec, exercise),
                               "checks": checks_fingerprint(exercise)}
    data = {"format": FORMAT, "built_by": "python -m autograder references", "exercises": exercises,
            "digest": digest(exercises)}
    # Keys keep the order observe() produced: checks walk scenarios in that order, and their sentences name the
    # first failing one, so a re-ordered file would give the same score in different words.
    return json.dumps(data, separators=(",", ":"), allow_nan=True) + "\n"


def write_references(path: Path = FILE) -> list[str]:
    course = load_course()
    observations = observe_public(course)
    text = build_file(course, observations)
    changed = not path.exists() or path.read_text() != text
    path.write_text(text)
    return [f"{'wrote' if changed else 'unchanged'} {path.name}: {len(observations)} exercises, "
            f"{len(text.encode()) / 1024:.0f} KiB, torch {version('torch')}, {device_kind(observations)}"]


def stale_references(path: Path = FILE) -> list[str]:
    """Why the shipped file does not match solutions/ and the checks (empty list: it does)."""
    rebuild = "run `python -m autograder generate` (or just `references`) and commit the file"
    try:
        data = json.loads(path.read_text())
        exercises = data["exercises"]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"{path.name} is missing or unreadable: {rebuild}"]
    problems = []
    if data.get("format") != FORMAT or data.get("digest") != digest(exercises):
        problems.append(f"{path.name} has another format or was edited by hand: {rebuild}")
    course = load_course()
    for exercise in sorted(set(course.exercises) | set(exercises)):
        entry = exercises.get(exercise)
        if exercise not in course.exercises:
            problems.append(f"{path.name} holds `{exercise}`, which no notebook in solutions/ has: {rebuild}")
        elif not isinstance(entry, dict):
            problems.append(f"{path.name} has no reference for `{exercise}`: {rebuild}")
        elif entry.get("solution") != solution_fingerprint(course.spec_for_exercise(exercise), exercise):
            problems.append(f"the solution or setup cells of `{exercise}` changed since {path.name} was built: {rebuild}")
        elif entry.get("checks") != checks_fingerprint(exercise):
            problems.append(f"the checks of `{exercise}` changed since {path.name} was built: {rebuild}")
    return problems
