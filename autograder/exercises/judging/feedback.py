"""Feedback, cause first: one structure (``sections``) that every place a student reads renders in its own format.

The test cell's plain-text report (``verdict.format_report``), grades.csv's feedback cell (``verdict.feedback_sentence``),
the feedback .md/.html files and the autograded notebook all come from ``sections(results, diagnosis)``:

1. a *cause* section for each diagnosed mistake: what the student did, what the observation shows, why it is
   wrong, the fix, then the failed checks that follow from it, without their own advice (each check's advice
   assumes it is the only failure, so next to a cause it would ask to change code that is right);
2. an *also* section with the failed checks no cause explains, each with its own advice; or, when nothing matched a
   known mistake, an *unknown* section saying so, with every failed check's advice;
3. the passed checks.

A function that still raises NotImplementedError everywhere gets one line; so does one whose every check failed
for one and the same reason (it raised the same error everywhere). Plain Python; the renderers escape.
"""
import re
from dataclasses import dataclass, field

from ..exercise import CheckResult
from .checking import NOT_DONE
from .diagnosis import Diagnosis
from .localise import DEDUCED

NOT_STARTED = f"Not started: {NOT_DONE[0].lower()}{NOT_DONE[1:]}"


@dataclass
class Section:
    kind: str                                  # "cause", "also", "unknown", "one_line" or "passed"
    heading: str                               # one sentence
    details: list[tuple[str, str]] = field(default_factory=list)   # (label, sentence): what was seen, why, the fix
    checks: list[CheckResult] = field(default_factory=list)
    advice: bool = True                        # show each check's own feedback
    cause_id: str = ""                         # the catalogue id of a "cause" section


def sections(results: list[CheckResult], diagnosis: Diagnosis | None = None) -> list[Section]:
    failed = [r for r in results if not r.passed]
    passed = [r for r in results if r.passed]
    tail = [Section("passed", "Passed:", checks=passed)] if passed else []
    if not failed:
        return tail
    if (diagnosis and diagnosis.kind == "not_started") or all(r.feedback == NOT_DONE for r in failed) and not passed:
        return [Section("one_line", NOT_STARTED)]
    located = list(diagnosis.located) if diagnosis is not None else []
    if diagnosis is None or diagnosis.kind != "cause":
        reasons = {r.feedback for r in failed}
        if located:
            return _located(located, failed, diagnosis) + tail
        if not passed and len(failed) > 1 and len(reasons) == 1:  # every check failed for one reason: say it once
            return [Section("one_line", failed[0].feedback)]
        heading = ("Your results do not match one known mistake; each failed check says what it saw:"
                   if diagnosis is not None else "Failed:")
        return [Section("unknown", heading, checks=failed)] + tail
    by_title = {r.title: r for r in failed}
    owner = {}  # each failed check is listed under the most specific cause that explains it
    for cause in sorted(diagnosis.causes, key=lambda c: len(c.explains)):
        for title in cause.explains:
            owner.setdefault(title, cause.id)
    shown, out = set(), []
    many = len(diagnosis.causes) > 1
    for number, cause in enumerate(diagnosis.causes, 1):
        checks = [by_title[t] for t in cause.explains if t in by_title and owner.get(t) == cause.id]
        shown |= {r.title for r in checks}
        lead = f"Mistake {number} of {len(diagnosis.causes)}" if many else "Most likely cause"
        where = [_label(line) for line in located if not _repeats(line, failed)] if number == 1 else []
        out.append(Section("cause", f"{lead} ({cause.id}): {cause.did}",
                           [("Seen in your results", cause.seen), *where, ("Why it is wrong", cause.why),
                            ("Fix", cause.fix)], checks, advice=False, cause_id=cause.id))
    rest = [r for r in failed if r.title not in shown]
    if rest:
        out.append(Section("also", "Also failing, not explained by the cause above:" if not many
                           else "Also failing, not explained by these causes:", checks=rest))
    return out + tail


def _located(located: list[str], failed: list[CheckResult], diagnosis: Diagnosis) -> list[Section]:
    """No cause named with confidence: where the results go wrong comes first; the failed checks it explains (their
    own words name a wrong result) follow without their advice, which assumed each was the only failure; the others
    keep theirs."""
    wrong = _wrong_words(located)
    raised = next((line.split(" when ", 1)[0].removeprefix("Your function raised ")[:60] for line in located
                   if line.startswith("Your function raised")), None)
    if raised is None:  # results shaped otherwise than the reference's: the checks quote the same words
        raised = next((line.split(" (", 1)[1].split(") when ", 1)[0][:60] for line in located
                       if line.startswith("Your function returned results") and " (" in line), None)
    if raised is None and any(line.startswith("Nothing raised, but") for line in located):  # localise.STOPPED
        raised = "(SIGABRT)" if any("(SIGABRT)" in line for line in located) else "the grader stopped them"
    explained = [r for r in failed if (wrong & _words(r.feedback)) or (raised and raised in (r.feedback or ""))]
    rest = [r for r in failed if r not in explained]
    out = []
    if diagnosis.kind == "consistent":
        names = " or ".join(c.did.rstrip(".") for c in diagnosis.causes)
        heading = f"Consistent with a known mistake, but not certain: {names}. What your results show:"
    else:
        heading = "Where your results go wrong (no known mistake fits them all):"
    out.append(Section("where", heading, [_label(line) for line in located], explained, advice=False))
    if rest:
        out.append(Section("also", "Also failing, each in its own words:" if explained else "Failed checks:",
                           checks=rest))
    return out


def _repeats(line: str, failed: list[CheckResult]) -> bool:
    """The line says what a failed check already says (a crash's sentence): beside a cause, it adds nothing."""
    return any(r.feedback and (r.feedback.rstrip(".") in line or line.rstrip(".") in r.feedback) for r in failed)


def _label(line: str) -> tuple[str, str]:
    if line.startswith("Right: "):
        return "Right", line.removeprefix("Right: ")
    if line.startswith("Right where it ran without raising: "):
        return "Right where it ran", line.removeprefix("Right where it ran without raising: ")
    if line.startswith("Your function raised"):
        return "Raised", line
    if line.startswith("Nothing raised, but"):
        return "Stopped", line
    if line.startswith(("Your function returned results", "Your function's results", "Your function gave no")):
        return "Returned", line
    if line.startswith(DEDUCED):
        return "Narrowed down", line.removeprefix(DEDUCED)
    if line.startswith("Later values differ"):
        return "Follows", line.removeprefix("Later values differ as a consequence: ")
    return "Wrong", line


def _wrong_words(located: list[str]) -> set[str]:
    """The names of the wrong results (each wrong line starts with one: "dk: wrong ...")."""
    return {line.split(": wrong", 1)[0] for line in located if ": wrong" in line}


def _words(sentence: str) -> set[str]:
    tokens = re.findall(r"[\w.]+", sentence or "")
    return {" ".join(tokens[i:i + n]) for n in (1, 2, 3) for i in range(len(tokens))}


def consequence_line(section: Section) -> str:
    n = len(section.checks)
    if not n:
        return "The checks it fails are listed under the other mistake: fix both."
    return f"This is why {n} check{'s' if n != 1 else ''} failed:"


def explained_line(section: Section) -> str:
    n = len(section.checks)
    return f"This is why {n} check{'s' if n != 1 else ''} failed:"


def text(exercise: str, score: str, results: list[CheckResult], diagnosis: Diagnosis | None) -> str:
    """The plain-text report (the test cell, the autograded notebook)."""
    lines = [f"{exercise}: {score} points"]
    for section in sections(results, diagnosis):
        if section.kind == "one_line":
            lines.append(f"  {section.heading}")
            continue
        lines.append(f"  {section.heading}")
        for label, sentence in section.details:
            lines.append(f"    {label}: {sentence}")
        if section.kind == "cause":
            lines.append(f"    {consequence_line(section)}")
        elif section.kind == "where" and section.checks:
            lines.append(f"    {explained_line(section)}")
        for r in section.checks:
            mark = "PASS" if r.passed else "FAIL"
            lines.append(f"    [{mark}] {r.title} ({r.score:g}/{r.points:g})")
            if r.feedback and section.advice:
                lines.append(f"           {r.feedback}")
    return "\n".join(lines)


def sentence(results: list[CheckResult], diagnosis: Diagnosis | None) -> str:
    """One cell of grades.csv: the cause first, then what it does not explain; or every failed check's sentence."""
    failed = [r for r in results if not r.passed]
    if not failed:
        return "All checks passed."
    parts = []
    for section in sections(results, diagnosis):
        if section.kind == "one_line":
            return section.heading
        if section.kind == "cause":
            cause = next(c for c in diagnosis.causes if c.id == section.cause_id)
            fix = cause.fix[:1].lower() + cause.fix[1:]
            follow = ("1 failed check follows" if len(section.checks) == 1
                      else f"{len(section.checks)} failed checks follow")
            parts.append(f"Cause {cause.id}: {cause.did} Fix: {fix} ({follow} from it.)")
        elif section.kind == "where":
            parts += [sentence for label, sentence in section.details if not label.startswith("Right")]
        elif section.kind in ("also", "unknown"):
            parts += [f"{r.title}: {r.feedback}" for r in section.checks]
    return " | ".join(parts)
