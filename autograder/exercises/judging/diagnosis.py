"""Diagnosis, cause first: which known mistake a submission's observation shows, and which failed checks follow.

One mistake fails many checks, and each check's advice assumes it is the only failure (a forgotten
``/ accumulation_steps`` fails six checks, four of whose hints ask to change code that is right). So before the
checks speak, the observation is compared with the catalogue of the exercise's known mistakes:
``autograder/exercises/<package>/mistakes.py`` holds ``MISTAKES = [Mistake(...), ...]`` (plain Python, no torch;
adding a catalogue is adding that one file). Each mistake says what the student did, why it is wrong and the fix,
and carries a *fingerprint*: a test of the parsed student observation against the reference's that returns what it
saw, in words ("with accumulation_steps=2 the first step's gradient is 2 × the reference's"), or None.

``diagnose`` then says one of:

* ``passed``: nothing failed;
* ``not_started``: the function still raises NotImplementedError everywhere (one line, not one per check);
* ``cause``: one or more catalogue mistakes whose fingerprints match, each with the failed checks it explains
  (their own advice is then withheld: it assumed they were the only failure); failed checks no cause explains keep
  their advice;
* ``consistent``: fingerprints match and what those mistakes need to be right is (``Mistake.requires``), but some
  failure is left unexplained: the localisation leads, and the mistakes are named only as possibilities, each only
  where nothing the localisation shows contradicts it (``hedges``); a mistake whose needs are not met, or that the
  localisation contradicts, is not named at all (its signs came from another bug);
* ``unknown``: the failures do not match a known mistake; the localisation (``localise.py``) says which results
  are wrong, where and by how much, and the failed checks it does not explain speak for themselves.

Every mistake whose fingerprint matches is reported, so two mistakes at once are never reported as one. A
fingerprint that cannot read what it needs (the scenario failed, a value is missing) simply does not match. The
diagnosis never changes a score.
"""
import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..exercise import CheckResult, Exercise
from .checking import NOT_DONE
from .localise import Localisation, Locate, localise
from .parse import parse_observation

ALL = ("",)  # ``Mistake.explains``: every failed check (the empty phrase is in every title)
EVERY = ("*",)  # ``Mistake.includes``: every other mistake


@dataclass(frozen=True)
class Mistake:
    id: str                       # short, stable, snake_case: grades.csv's `cause` column and the class report
    did: str                      # what the student did, one sentence ("You call backward() on ...")
    why: str                      # why that is wrong, one sentence
    fix: str                      # what to change, one sentence
    seen: Callable[[dict, dict], str | None]  # (parsed student, reference) -> what the observation shows, or None
    explains: tuple[str, ...] = ALL           # phrases of the titles of the checks that fail because of it
    variants: tuple[str, ...] = ()            # named wrong variants (tests/variants) it stands for, besides its id
    # ids of mistakes this one includes (EVERY: all), dropped when it matches: a function that does nothing also
    # "forgets" each of the exercise's steps, but that is one mistake, not many
    includes: tuple[str, ...] = ()
    # what must be RIGHT for the mistake to fit, (parsed student, reference) -> bool: the fingerprint's signs can
    # come from other mistakes too (which ranks come out right); when this fails or cannot be read, the mistake is
    # not named at all, not even as a possibility: the localisation speaks
    requires: Callable[[dict, dict], bool] | None = None


@dataclass(frozen=True)
class Cause:
    id: str
    did: str
    why: str
    fix: str
    seen: str
    explains: tuple[str, ...]     # titles of the failed checks it explains


@dataclass(frozen=True)
class Diagnosis:
    kind: str                               # "passed", "not_started", "cause", "consistent" or "unknown"
    causes: tuple[Cause, ...] = ()
    unexplained: tuple[str, ...] = ()       # titles of failed checks that no cause explains
    located: tuple[str, ...] = ()           # localisation.py's sentences: what is wrong, where, by how much; right
    located_short: str = ""                 # "dk ×√d": grades.csv's `cause` when no cause is named with confidence

    @property
    def cause_id(self) -> str:
        """grades.csv's `cause`: the catalogue id(s), joined by "+" when several, "not_started", or the
        localisation's short form (``dk ×√d``) when no cause is named with confidence, or empty."""
        if self.kind == "not_started":
            return "not_started"
        if self.kind == "cause":
            return "+".join(c.id for c in self.causes)
        return f"where: {self.located_short}" if self.located_short else ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> "Diagnosis | None":
        if not data:
            return None
        causes = tuple(Cause(**{**c, "explains": tuple(c["explains"])}) for c in data.get("causes", ()))
        return cls(data["kind"], causes, tuple(data.get("unexplained", ())), tuple(data.get("located", ())),
                   str(data.get("located_short", "")))


def _mistakes_module(exercise: Exercise):
    try:
        return importlib.import_module(f"{exercise.package}.mistakes")
    except ModuleNotFoundError as exc:
        if exc.name != f"{exercise.package}.mistakes":
            raise
        return None


def catalogue(exercise: Exercise) -> list[Mistake]:
    """The exercise's known mistakes (``<package>.mistakes.MISTAKES``), or none when it has no catalogue."""
    return list(getattr(_mistakes_module(exercise), "MISTAKES", []))


def locate_spec(exercise: Exercise) -> Locate:
    """The exercise's localisation declaration (``<package>.mistakes.LOCATE``), or the generic one."""
    return getattr(_mistakes_module(exercise), "LOCATE", None) or Locate()


def located(exercise: Exercise, parsed: dict, reference: dict) -> Localisation | None:
    """The localisation of a failed observation, or None when it finds nothing (it never stops a diagnosis)."""
    try:
        found = localise(locate_spec(exercise), parsed, reference)
    except Exception:  # a shape nobody foresaw: no localisation, the checks still speak
        return None
    return None if found.empty else found


def not_started(results: list[CheckResult], student=None) -> bool:
    """Every check failed, because the function still raises NotImplementedError: every check says so, or no
    scenario of the student's observation produced a result and they raised NotImplementedError (a scenario's error,
    or a call's, a rank's), but for a call the scaffold's signature would have taken."""
    if not results or any(r.passed for r in results):
        return False
    if all(r.feedback == NOT_DONE for r in results):
        return True
    scenarios = student.get("scenarios") if isinstance(student, dict) else None
    if not isinstance(scenarios, dict) or not scenarios:
        return False
    blank = [_raises_not_implemented(s) for s in scenarios.values()]
    return any(blank) and all(b or _raised_on_arguments(s) for b, s in zip(blank, scenarios.values()))


def _raised_on_arguments(scenario) -> bool:
    error = scenario.get("error") if isinstance(scenario, dict) else None
    return isinstance(error, str) and error.startswith("TypeError") and "argument" in error[:300]


def _raises_not_implemented(value, depth: int = 4) -> bool:
    """The scenario (or a record inside it, a few levels deep) failed with NotImplementedError."""
    if isinstance(value, dict):
        error = value.get("error")
        if value.get("not_done") is True or (isinstance(error, str) and "NotImplementedError" in error[:200]):
            return True
        items = list(value.values())
    elif isinstance(value, list):
        items = value[:64]
    else:
        return False
    return depth > 0 and any(_raises_not_implemented(v, depth - 1) for v in items if isinstance(v, dict | list))


def diagnose(exercise: Exercise, student: dict, reference: dict, results: list[CheckResult],
             mistakes: list[Mistake] | None = None) -> Diagnosis:
    """The diagnosis of one observation already graded into ``results`` (see the module docstring)."""
    failed = [r.title for r in results if not r.passed]
    if not failed:
        return Diagnosis("passed")
    if not_started(results, student):
        return Diagnosis("not_started")
    parsed = {**parse_observation(student, reference), "raw": student}  # "raw": see raw_text
    where = located(exercise, parsed, reference)
    lines, short = (tuple(where.lines()), where.short) if where else ((), "")
    matched = []
    for mistake in catalogue(exercise) if mistakes is None else mistakes:
        seen = fingerprint(mistake, parsed, reference)
        titles = tuple(t for t in failed if any(phrase in t for phrase in mistake.explains)) if seen else ()
        if titles:  # a mistake that explains no failure here is not this submission's problem
            matched.append((mistake, Cause(mistake.id, mistake.did, mistake.why, mistake.fix, seen, titles)))
    included = {other.id for mistake, _ in matched for other, _ in matched if other is not mistake
                and (EVERY == mistake.includes or other.id in mistake.includes)}
    kept = [(mistake, cause) for mistake, cause in matched if mistake.id not in included]
    if not kept:
        return Diagnosis("unknown", (), tuple(failed), lines, short)
    record, timed = known(exercise), bool(getattr(exercise, "ranks", False))
    # what a mistake needs to be right is not (Mistake.requires): its own signature does not fit, so it is no cause,
    # not even a possible one (a ring that forgets a rescale is not told it averages)
    fits = [cause for mistake, cause in kept if holds(mistake, parsed, reference)]
    if not fits:
        return Diagnosis("unknown", (), tuple(failed), lines, short)
    if not fits_completely(fits, record, failed, where, timed):
        # the signs are there, but the evidence does not fit completely: a possibility only where nothing the
        # localisation shows contradicts what the mistake does (only failures it does not explain are left over)
        hedged = hedges(fits, record, where, timed)
        if not hedged:
            return Diagnosis("unknown", (), tuple(failed), lines, short)
        return Diagnosis("consistent", hedged, tuple(failed), lines, short)
    fits.sort(key=lambda c: -len(c.explains))  # the most likely first: the one that explains the most
    return Diagnosis("cause", tuple(fits), (), lines, short)


def hedges(causes: list[Cause], record: dict, where: Localisation | None, timed: bool) -> tuple[Cause, ...]:
    """The causes that may be named as a possibility ("consistent with"): all of them when the localisation does not
    contradict them together, else each one it does not contradict on its own; a cause without a record, or a
    submission without a localisation, gives nothing to contradict."""
    if where is None or not all(record.get(c.id) for c in causes) or not contradictions(
            [record[c.id] for c in causes], where, timed):
        return tuple(causes)
    return tuple(c for c in causes if not contradictions([record[c.id]], where, timed))


def fits_completely(causes: list[Cause], record: dict, failed: list[str], where: Localisation | None,
                    timed: bool = False) -> bool:
    """The causes account for all the evidence: every failed check is one they explain, and nothing in the
    localisation contradicts what these mistakes do (``contradictions``). Another bug that happens to match a
    fingerprint (which ranks come out right, the norms above max_norm) differs somewhere else."""
    if any(t not in {e for cause in causes for e in cause.explains} for t in failed):
        return False
    seen = [record.get(cause.id) for cause in causes]
    if not all(seen) or where is None:  # no record for a cause: its explained checks are all there is to go on
        return True
    return not contradictions(seen, where, timed)


# What a mistake does, both ways, in terms that hold under any salt and any timing of the ranks: which results it
# makes wrong (and so which stay right), in which scenarios (a setting where it changes nothing stays right), and
# of what kind (zeros, not finite, a crash, an exact named factor or a plain difference) -- never which checks fail,
# nor which factor a race happens to show.
SPECIAL = ("zeros", "not finite", "unchanged", "transposed", "shifted by one", "missing", "of another length",
           "not numbers")


def contradictions(seen: list[dict], where: Localisation, timed: bool = False) -> list[str]:
    """What the localisation shows that the mistakes' record (``known_fails.py``, their named variants under every
    salt they are graded with) says they never do, or what they always get wrong that is right here. ``timed``: a
    rank exercise, where a racing mistake's factor and direction vary with timing: they are not compared."""
    wrong = {q for s in seen for q in s["wrong"]}
    places = {p for s in seen for p in s.get("places", ())}
    kinds: dict[str, set[str]] = {}
    for s in seen:
        for sign in s.get("signs", ()):
            quantity, _, kind = sign.rpartition(": ")
            kinds.setdefault(quantity, set()).add(kind)
    found = set(where.wrong_quantities) | set(where.follow)
    out = [f"{q}: wrong" for q in sorted(found - wrong)]  # a result the mistake leaves right
    scenarios = {p.split(" @ ")[-1] for p in places}
    if scenarios:  # wrong in a scenario where the mistake changes nothing at all
        out += sorted({p.split(" @ ")[-1] for p in where.places} - scenarios)
    if where.crashed and not any("raised" in s.get("signs", ()) for s in seen):
        out.append("raised")
    for sign in where.signs:
        quantity, _, kind = sign.rpartition(": ")
        recorded = kinds.get(quantity)
        if sign == "raised" or not recorded:
            continue
        if _category(kind) not in {_category(k) for k in recorded}:
            out.append(sign)  # zeros where the mistake gives a plain difference, NaN where it gives finite values
        elif timed:  # ranks: a racing mistake's factor varies from run to run (measured: BucketedDDP, MiniFSDP)
            continue
        elif _named(kind) and not any(_named(k) for k in recorded):
            out.append(sign)  # an exact named factor where the mistake's difference is no factor at all
        elif kind == "off" and all(_named(k) for k in recorded):
            out.append(sign)  # no factor where the mistake always gives one
    sizes: dict[str, set[str]] = {}
    for s in seen:
        for size in s.get("sizes", ()):
            quantity, _, way = size.rpartition(": ")
            sizes.setdefault(quantity, set()).add(way)
    mine: dict[str, set[str]] = {}
    for size in where.sizes:
        quantity, _, way = size.rpartition(": ")
        mine.setdefault(quantity, set()).add(way)
    out += [f"{q}: {'/'.join(sorted(ways))}" for q, ways in sorted(mine.items())  # only smaller where it makes it larger
            if q in sizes and not ways & sizes[q] and not timed]
    certain = {q for s in seen for q in s.get("certain", ())}  # wrong first in every run of its variants
    out += [f"{q}: right" for q in sorted(certain & set(where.right))]
    if not timed:  # where the variants are wrong whatever the data: right here is no sign of them
        # only for the results they always get wrong first: which other results a data-dependent mistake spoils
        # depends on the salt (clips_before_unscaling leaves the given scaler's scales right under most salts)
        certain_places = {p for s in seen for p in s.get("certain_places", ()) if p.split(" @ ")[0] in certain}
        out += [f"{p}: right" for p in sorted(certain_places & set(where.right_places))]
        out += [f"{p}: wrong" for p in where.parts if all(p in s.get("right_parts", ()) for s in seen)]
    return out


def _category(kind: str) -> str:
    moved = kind == "another's values" or kind.startswith("one ") and kind.endswith((" late", " early"))
    return kind if kind in SPECIAL or moved else "value"


def _named(kind: str) -> bool:
    return kind.startswith(("×", "÷", "+", "−")) and kind != "off"


def known(exercise: Exercise) -> dict[str, dict[str, tuple[str, ...]]]:
    """Per mistake id, what its named variants were seen to do (``known_fails.py``, generated from tests/variants
    by ``tests/known_fails.py``): the checks they always fail ("always"), may fail ("may"), the results the
    localisation finds wrong for them ("wrong") and how ("signs")."""
    from .known_fails import KNOWN

    return KNOWN.get(exercise.name, {})


def holds(mistake: Mistake, student: dict, reference: dict) -> bool:
    """What the mistake needs to be right is right (a mistake that states nothing: True)."""
    if mistake.requires is None:
        return True
    try:
        return mistake.requires(student, reference) is True
    except Exception:  # cannot be read: not confirmed
        return False


def fingerprint(mistake: Mistake, student: dict, reference: dict) -> str:
    """What the mistake's fingerprint saw, or "" when it does not match or cannot read what it needs."""
    try:
        seen = mistake.seen(student, reference)
    except Exception:  # a failed scenario, a missing or malformed value: then this is not what it shows
        return ""
    if not isinstance(seen, str) or not seen.strip():
        return ""
    seen = seen.strip()
    return seen if seen.endswith((".", "!", ")")) else seen + "."


# ---- helpers for fingerprints ----------------------------------------------------------------------

def ran(observation: dict, key: str) -> dict:
    """The scenario's data when it ran; KeyError otherwise (the fingerprint then does not match)."""
    data = observation["scenarios"][key]
    if not isinstance(data, dict) or "error" in data:
        raise KeyError(key)
    return data


def error_of(observation: dict, key: str) -> str:
    """The scenario's error, or "" when it ran."""
    data = observation["scenarios"].get(key)
    return str(data.get("error", "")) if isinstance(data, dict) else ""


def raw_text(observation: dict, key: str, name: str) -> str | None:
    """A short text value from the student's *unparsed* scenario (e.g. the type name of what the function returned,
    which a scenario that did not parse loses), or None. Only for words in a diagnosis: it never reaches a score."""
    raw = observation.get("raw")
    data = raw.get("scenarios", {}).get(key) if isinstance(raw, dict) and isinstance(raw.get("scenarios"), dict) else None
    value = data.get(name) if isinstance(data, dict) else None
    return value[:40] if isinstance(value, str) else None


def raw_scenario(observation: dict, key: str) -> dict:
    """The student's *unparsed* scenario (KeyError when absent): what a scenario that did not parse still holds.
    Untrusted shapes: read it defensively (a fingerprint's exception only means "no match"). Never for a score."""
    data = observation["raw"]["scenarios"][key]
    if not isinstance(data, dict):
        raise KeyError(key)
    return data
