"""The reference observations that ship to students: what a test cell compares with when the solutions are absent.

``python -m autograder references`` (or ``generate``) observes every reference solution in ``solutions/`` on the
*public* scenarios (salt 0) and writes one file per exercise, ``autograder/references/<exercise>.json``; the
student kit ships them. Each file records the torch version and device it was observed on and two fingerprints: of
the solution it came from (setup cells + solution cell; checked by the instructor's CI) and of the exercise's code
(its package and the shared exercise modules; checked here, so a kit whose checks and data disagree says so). It
carries a digest of its content, so a truncated or edited file is reported instead of trusted.

This is a convenience for self-checks, not a trust boundary: the class grader computes its references from the
solutions in its own process, on held-out scenarios, and never reads these files.
"""
import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..exercises import get_exercise
from .fingerprint import code_fingerprint, exercise_code

FOLDER = Path(__file__).resolve().parent.parent / "references"
FORMAT = 2
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


def digest(entry: dict) -> str:
    """Of a reference file's content, its own "digest" left out."""
    return hashlib.sha256(canonical({k: v for k, v in entry.items() if k != "digest"})).hexdigest()


def reference_file(exercise: str, folder: Path | None = None) -> Path:
    return (folder or FOLDER) / f"{exercise}.json"


def checks_fingerprint(exercise: str) -> str:
    """Of the code that observes and judges the exercise (``fingerprint.exercise_code``)."""
    return code_fingerprint(exercise_code(get_exercise(exercise).package))


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
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("observation"), dict):
        raise ReferenceUnavailable(f"The reference results file {path.name} is not one this version of the course "
                                   f"reads: {REINSTALL}.")
    if data.get("digest") != digest(data):
        raise ReferenceUnavailable(f"The reference results file {path.name} was changed after it was built, so it "
                                   f"cannot be trusted even for a self-check: {REINSTALL}.")
    return data


def load_recorded(exercise: str, folder: Path | None = None) -> RecordedReference:
    """The shipped reference observation of ``exercise``, or ReferenceUnavailable with a sentence saying why not."""
    data = _load(reference_file(exercise, folder))
    if data.get("exercise") != exercise:
        raise ReferenceUnavailable(f"The reference results file for `{exercise}` holds another exercise: {REINSTALL}.")
    if data.get("checks") != checks_fingerprint(exercise):
        raise ReferenceUnavailable(f"The checks of `{exercise}` in this installation are not the ones its reference "
                                   f"results were recorded for (a partly updated kit?): {REINSTALL}.")
    return RecordedReference(exercise, data["observation"], str(data.get("torch", "?")), str(data.get("device", "?")))


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
