"""The reference observations that ship to students: what a test cell compares with when the solutions are absent.

The instructor's ``python -m autograder references`` observes every reference solution in ``solutions/`` on the
*public* scenarios (salt 0) and writes ``reference_observations.json`` next to this module; the student kit ships
it. Each exercise's entry records the torch version and device it was observed on and two fingerprints: of the
solution it came from (setup cells + solution cell; checked by the instructor's CI) and of the checks that read it
(the exercise module and the shared helpers; checked here, so a kit whose checks and data disagree says so). The
file carries a digest of its content, so a truncated or edited file is reported instead of trusted.

This is a convenience for self-checks, not a trust boundary: the class grader computes its references from the
solutions in its own process, on held-out scenarios, and never reads this file.
"""
import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FILE = Path(__file__).with_name("reference_observations.json")
FORMAT = 1
REINSTALL = "reinstall the course kit (`pip install --force-reinstall` of the file your instructor gave you)"


class ReferenceUnavailable(Exception):
    """The shipped reference cannot be used; the message is one plain sentence for the student."""


@dataclass(frozen=True)
class RecordedReference:
    exercise: str
    observation: dict
    torch: str      # torch.__version__ where it was observed, e.g. "2.13.0+cpu"
    device: str     # "cpu" or "cuda": the device kind its scenarios ran on


def canonical(data) -> bytes:
    """One byte string per JSON value: the digest and the fingerprints hash this."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def digest(exercises: dict) -> str:
    return hashlib.sha256(canonical(exercises)).hexdigest()


def checks_fingerprint(exercise: str) -> str:
    """Hash of the code that reads the observation: the exercise's module and the shared exercise helpers."""
    from . import exercise as helpers
    from .exercises import get_exercise

    module = __import__(get_exercise(exercise).observe.__module__, fromlist=["_"])
    sha = hashlib.sha256()
    for source in (Path(helpers.__file__), Path(module.__file__)):
        sha.update(source.read_bytes())
    return sha.hexdigest()[:16]


@cache
def _load(path: Path) -> dict:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ReferenceUnavailable(f"The reference results this check compares with are missing ({path.name} is "
                                   f"not installed): {REINSTALL}.") from None
    except OSError as exc:
        raise ReferenceUnavailable(f"The reference results could not be read ({exc.strerror}): {REINSTALL}.") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise ReferenceUnavailable(f"The reference results file {path.name} is damaged (not complete JSON, "
                                   f"perhaps cut short): {REINSTALL}.") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("exercises"), dict):
        raise ReferenceUnavailable(f"The reference results file {path.name} is not one this version of the course "
                                   f"reads: {REINSTALL}.")
    if data.get("digest") != digest(data["exercises"]):
        raise ReferenceUnavailable(f"The reference results file {path.name} was changed after it was built, so it "
                                   f"cannot be trusted even for a self-check: {REINSTALL}.")
    return data


def load_recorded(exercise: str, path: Path | None = None) -> RecordedReference:
    """The shipped reference observation of ``exercise``, or ReferenceUnavailable with a sentence saying why not."""
    data = _load(path or FILE)
    entry = data["exercises"].get(exercise)
    if not isinstance(entry, dict) or not isinstance(entry.get("observation"), dict):
        raise ReferenceUnavailable(f"The reference results file has nothing for `{exercise}`: {REINSTALL}.")
    if entry.get("checks") != checks_fingerprint(exercise):
        raise ReferenceUnavailable(f"The checks of `{exercise}` in this installation are not the ones its reference "
                                   f"results were recorded for (a partly updated kit?): {REINSTALL}.")
    return RecordedReference(exercise, entry["observation"], str(entry.get("torch", "?")),
                             str(entry.get("device", "?")))


def on_this_machine(recorded: RecordedReference, student: dict) -> dict:
    """The recorded reference without the scenarios on a device this machine lacks (keys ``name@device`` the
    student's observation does not have: observe() records every scenario it can run, failed ones included)."""
    ours = student.get("scenarios") if isinstance(student, dict) else None
    theirs = recorded.observation.get("scenarios", {})
    if not isinstance(ours, dict):
        return recorded.observation
    kept = {key: value for key, value in theirs.items() if "@" not in key or key in ours}
    return {**recorded.observation, "scenarios": kept}


def setting_notes(recorded: RecordedReference, student: dict, torch_version: str) -> list[str]:
    """One line for each way this check differs from the recorded reference's setting (none: an empty list)."""
    notes = []
    if torch_version.split("+")[0] != recorded.torch.split("+")[0]:
        notes.append(f"Note: torch {torch_version} here, {recorded.torch} where the reference was recorded. The checks "
                     "allow float round-off only; if one fails here on a value that is nearly right, the instructor's "
                     "grader (which computes its own reference) is the judge.")
    ours = student.get("scenarios") if isinstance(student, dict) else None
    theirs = recorded.observation.get("scenarios", {})
    unmatched = sorted(set(ours or {}) - set(theirs))
    if unmatched:
        devices = sorted({key.partition("@")[2] or "this device" for key in unmatched})
        notes.append(f"Note: only the scenarios recorded on {recorded.device} were checked; your function's "
                     f"{len(unmatched)} scenario(s) on {', '.join(devices)} have no recorded reference in this kit "
                     "(the instructor's grader checks them on a machine that has one).")
    missing = sorted(key for key in theirs if "@" in key and key not in (ours or {}))
    if missing:
        devices = sorted({key.partition("@")[2] for key in missing})
        notes.append(f"Note: {len(missing)} recorded scenario(s) on {', '.join(devices)} were not checked: this "
                     "machine has no such device (the instructor's grader checks them on one that has).")
    return notes
