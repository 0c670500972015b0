"""Parse, don't validate: a student's observation turned into data shaped like the reference's, at one boundary.

Everything in a student's observation was produced next to their code, so its shape is a claim. Before any check
reads it, ``parse_observation`` rebuilds it from the *reference's* observation, scenario by scenario:

* exactly the reference's scenarios (a missing one becomes that scenario's error; extra ones are dropped), each
  with the reference's ``case``, never the student's copy;
* every key the reference's scenario has, recursively (extra keys dropped; a missing key is malformed);
* a record may instead be an *error record* (``{"error": text, <flags>}``): the function raised there, which the
  observers record in place of the value record and the checks report as such; where the reference's record is
  the error record, the student's may be a few scalars (the function returned instead);
* a numeric vector (a list of at least ``VECTOR`` numbers in the reference) has exactly the reference's length:
  another length is the function's behaviour (fewer steps, say), reported as a difference in shape, not as garbage;
* other lists hold at most a few times the reference's number of items; strings at most ``TEXT_CHARS``;
  numbers are numbers, booleans booleans; ``None`` is always accepted (a value the function did not produce);
* at most ``VALUE_BUDGET`` values in all.

A scenario that does not parse becomes ``{"case": ..., "error": <one sentence>}``, which the checks report like any
other failure of that scenario; the rest of the observation still counts. Reference-only data (a scenario's
``truth``, or extras beside the scenarios: ground truths observed with torch's own implementations) are never taken
from the student. Plain Python: no torch.
"""
import json
from numbers import Real

from .checking import DIFFERENT, MALFORMED, MISSING

TEXT_CHARS = 300          # an error message or a type name; feedback quotes at most this much
VECTOR = 8                # a list of at least this many numbers in the reference is data: its length is exact
LIST_SLACK, LIST_FLOOR = 4, 256
VALUE_BUDGET = 2_000_000  # the largest honest observation holds about 40,000 values
FREE_DEPTH = 4


MAX_DEPTH = 32            # nesting of an observation (the exercises need 6)
MAX_RECORDS = 200_000     # JSON objects in one message: a reply of millions of {} is refused, not built


class BadMessage(Exception):
    """Bytes from a process that ran student code that are not a well-formed message."""


def within_depth(value, limit: int = MAX_DEPTH) -> bool:
    """True if lists/objects nest at most ``limit`` deep (checked without recursion)."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return True


def loads_bounded(data: bytes | str, *, limit: int, depth: int = MAX_DEPTH):
    """json.loads with bounds on size, records and nesting, checked before and while it builds anything;
    BadMessage instead of any other error."""
    if len(data) > limit:
        raise BadMessage(f"larger than {limit} bytes")
    records = [0]

    def record(pairs):
        records[0] += 1
        if records[0] > MAX_RECORDS:
            raise BadMessage(f"more than {MAX_RECORDS} records")
        return dict(pairs)

    try:
        value = json.loads(data, object_pairs_hook=record)
    except RecursionError:
        raise BadMessage("nested too deeply") from None
    except (ValueError, TypeError) as exc:
        raise BadMessage(f"not JSON ({type(exc).__name__})") from None
    if isinstance(value, dict | list) and not within_depth(value, depth):
        raise BadMessage("nested too deeply")
    return value


class Malformed(Exception):
    prefix = MALFORMED

    def __init__(self, path: str, why: str):
        super().__init__(f"{path or 'the result'} {why}")


class Different(Malformed):
    """Well-formed, but shaped otherwise than the reference's: the function behaved differently."""
    prefix = DIFFERENT


def parse_observation(student, reference: dict) -> dict:
    """The student's observation, rebuilt on the reference's scenarios and shapes (see the module docstring)."""
    ours = student.get("scenarios") if isinstance(student, dict) else None
    ours = ours if isinstance(ours, dict) else {}
    budget = [VALUE_BUDGET]
    scenarios = {}
    for key, theirs in reference["scenarios"].items():
        scenarios[key] = parse_scenario(ours.get(key), theirs, budget)
    return {"salt": reference.get("salt"), "scenarios": scenarios}


def parse_scenario(value, template: dict, budget: list[int]) -> dict:
    case = template["case"]
    if "error" in template:  # the reference itself could not run it (a device the grader's sandbox lacks)
        return template
    if not isinstance(value, dict):
        return {"case": case, "error": MISSING}
    if "error" in value:
        error = value["error"]
        return {"case": case, "error": error[:TEXT_CHARS] if isinstance(error, str) else "an unreadable error"}
    measured = {k: v for k, v in template.items() if k not in ("case", "truth")}
    try:
        return {"case": case, **parse(value, measured, "", budget)}
    except Malformed as problem:
        return {"case": case, "error": f"{problem.prefix}{problem}"}


def kind(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Real):
        return "number"
    if isinstance(value, str):
        return "text"
    return "list" if isinstance(value, list) else "dict" if isinstance(value, dict) else "other"


def spend(budget: list[int], n: int, path: str) -> None:
    budget[0] -= n
    if budget[0] < 0:
        raise Malformed(path, "is part of a result far larger than any correct function's")


def parse(value, template, path: str, budget: list[int]):
    want, got = kind(template), kind(value)
    if got == "none":
        return None
    if want == "dict":
        if got != "dict":
            raise Malformed(path, f"is a {got}, not a record")
        if "error" in value:
            return error_record(value, path, budget)
        if "error" in template:  # the reference raised here; the function returned instead
            return scalar_record(value, path, budget)
        missing = [k for k in template if k not in value]
        if missing:
            raise Malformed(path, f"has no {missing[0]!r}")
        return {k: parse(value[k], t, f"{path}.{k}".lstrip("."), budget) for k, t in template.items()}
    if want == "list":
        return parse_list(value, template, path, budget)
    if want in ("bool", "number", "text"):
        if got != want and not (want == "none"):
            raise Malformed(path, f"is a {got}, not a {want}")
        spend(budget, 1, path)
        return value[:TEXT_CHARS] if got == "text" else value
    return free_form(value, path, budget, FREE_DEPTH)  # the reference holds None here: anything small


def parse_list(value, template: list, path: str, budget: list[int]) -> list:
    if kind(value) != "list":
        raise Malformed(path, f"is a {kind(value)}, not a list")
    if template and all(kind(t) == "number" for t in template):  # numbers: a data vector keeps its exact length
        exact = len(template) >= VECTOR  # (a shape or a few counts may legitimately differ in length)
        if len(value) > max(LIST_SLACK * len(template), LIST_FLOOR) or not all(kind(v) == "number" for v in value):
            raise Malformed(path, f"is not {len(template)} numbers" if exact else "is not a short list of numbers")
        if exact and len(value) != len(template):
            raise Different(f"`{path}`", f"has {len(value)} values where the reference's has {len(template)}")
        spend(budget, len(value), path)
        return list(value)
    limit = max(LIST_SLACK * len(template), LIST_FLOOR)
    if len(value) > limit:
        raise Malformed(path, f"holds {len(value)} items, far more than any correct function's")
    spend(budget, len(value), path)
    parsed = []
    for i, item in enumerate(value):
        like = template[min(i, len(template) - 1)] if template else None
        if like is not None and kind(like) == kind(item):
            parsed.append(parse(item, like, f"{path}[{i}]", budget))
        else:
            parsed.append(free_form(item, f"{path}[{i}]", budget, FREE_DEPTH))
    return parsed


ERROR_FLAGS = 8  # booleans an error record may carry beside its text (value_error, not_done, ...)


def error_record(value: dict, path: str, budget: list[int]) -> dict:
    """``{"error": text, <a few boolean flags>}``: what the observers record where the function raised."""
    if kind(value["error"]) != "text":
        raise Malformed(f"{path}.error".lstrip("."), f"is a {kind(value['error'])}, not a text")
    flags = {k: v for k, v in value.items() if k != "error" and isinstance(v, bool) and len(k) <= 40}
    spend(budget, 1 + len(flags), path)
    return {"error": value["error"][:TEXT_CHARS], **dict(list(flags.items())[:ERROR_FLAGS])}


def scalar_record(value: dict, path: str, budget: list[int]) -> dict:
    """A few short scalar fields: what an observer records where a function returned a value."""
    fields = [(k, v) for k, v in value.items() if len(k) <= 40 and kind(v) in ("none", "bool", "number", "text")]
    spend(budget, len(fields), path)
    return {k: v[:TEXT_CHARS] if kind(v) == "text" else v for k, v in fields[:ERROR_FLAGS]}


def free_form(value, path: str, budget: list[int], depth: int):
    """A small value of any shape: scalars (short text), lists of them, a few levels deep; no records."""
    got = kind(value)
    spend(budget, 1, path)
    if got in ("none", "bool", "number"):
        return value
    if got == "text":
        return value[:TEXT_CHARS]
    if got == "list" and depth > 0 and len(value) <= LIST_FLOOR:
        return [free_form(v, f"{path}[{i}]", budget, depth - 1) for i, v in enumerate(value)]
    raise Malformed(path, "is not a value the grader records here")
