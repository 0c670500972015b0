"""The checks of ``zero_memory_per_rank``: plain Python on the observations."""
from itertools import combinations

from ..judging.checking import NOT_DONE, ScenarioError, case, off_by, scenario
from .cases import BUFFERS, DEFAULT, RTOL, SHARDED, STAGES, _what


def describe(reference, role, stage):
    c = case(reference, role)
    return _what(c["num_params"], c["world_size"], c["bytes_per_param"], stage)


def call(observation, reference, role, stage) -> dict:
    """What the function did for (role, stage): a dict with "value" or "error"; ScenarioError if missing."""
    calls = scenario(observation, role, what_for(reference, role))["calls"]
    index = stage if role != "invalid" else case(reference, role)["stages"].index(stage)
    if not isinstance(calls, list) or len(calls) <= index or not isinstance(calls[index], dict):
        raise ScenarioError(f"No result for {describe(reference, role, stage)}: the grader's observation is "
                            "incomplete.")
    return calls[index]


def what_for(reference, role):
    return case(reference, role)["what"]


def value(observation, reference, role, stage):
    data = call(observation, reference, role, stage)
    if "error" in data:
        if data.get("not_done"):
            raise ScenarioError(NOT_DONE)
        raise ScenarioError(f"Your function raised {data['error']} for {describe(reference, role, stage)}.")
    if data.get("value") is None:
        raise ScenarioError(f"For {describe(reference, role, stage)} your function returned a {data.get('type')}"
                            f"{' ' + repr(data['text']) if data.get('text') else ''}, not a number of bytes.")
    return data["value"]


def _close(got, want):
    return abs(got - want) <= RTOL * abs(want) + 1e-6


def _bytes(c, subset, layout=None):
    """Bytes per rank for the case `c` when the buffers in `subset` are divided by the world size."""
    b = layout or c["bytes_per_param"] or DEFAULT
    return sum(b[i] * c["num_params"] / (c["world_size"] if i in subset else 1) for i in range(3))


def _which_sharded(got, c):
    """The set of buffers the student's value divides by N, if one explains it exactly."""
    for k in range(4):
        for subset in combinations(range(3), k):
            if _close(got, _bytes(c, subset)):
                return subset
    return None


def _names(indices):
    return " and ".join(BUFFERS[i] for i in indices) if indices else "nothing"


def compare(student, reference, roles, stages):
    """None, or a sentence about the first (role, stage) where the student's bytes differ."""
    for role in roles:
        c = case(reference, role)
        for stage in stages:
            got, want = value(student, reference, role, stage), value(reference, reference, role, stage)
            if _close(got, want):
                continue
            message = f"For {describe(reference, role, stage)} you return {got:,.1f} bytes, {off_by(got, want)}"
            layout = c["bytes_per_param"]
            if abs(got - want) <= sum(layout or DEFAULT) + 1:
                return message + ": a rounding difference; keep the exact quotient (use /, not // or rounding)."
            if layout and _close(got, _bytes(c, SHARDED[stage], DEFAULT)):
                return message + ": that is what the default (2, 2, 12) gives; use the bytes_per_param argument."
            subset = _which_sharded(got, c) if c["world_size"] > 1 else None
            if subset is not None:
                return (f"{message}: your value divides {_names(subset)} by world_size, but stage {stage} "
                        f"divides {_names(SHARDED[stage])}.")
            return message + "."
    return None


# ---- the checks ----------------------------------------------------------------------------

def roles(reference):
    """The roles called with a valid stage, in observation order."""
    return [role for role in reference["scenarios"] if role != "invalid"]


def some_bytes_right(got: dict, want: dict) -> str | None:
    """The evidence: for some stage the function returned the reference's bytes (in bytes, GB or GiB) for this
    scenario's numbers. A constant, or a function that only raises, cannot."""
    for mine, theirs in zip(got["calls"], want["calls"]):
        value = mine.get("value") if isinstance(mine, dict) else None
        if isinstance(value, (int, float)) and any(_close(value * unit, theirs["value"]) for unit in (1, 1e9, 2**30)):
            return None
    return f"when {want['case']['what']}, your function returned the right number of bytes for no stage."


def check_paper(student, reference):
    for stage in STAGES:
        got, want = value(student, reference, "paper", stage), value(reference, reference, "paper", stage)
        if _close(got * 1e9, want) or _close(got * 2**30, want):
            return ("You return gigabytes; return bytes (the paper's 31.4 GB is 31,406,250,000 bytes) and convert "
                    "only when you print.")
    problem = compare(student, reference, ["paper"], STAGES)
    return problem and problem.replace("For num_params", "In the paper's example, num_params", 1)


def check_number(student, reference):
    results = [(role, stage, call(student, reference, role, stage)) for role in roles(reference) for stage in STAGES]
    if any(data.get("not_done") for _, _, data in results):
        raise ScenarioError(NOT_DONE)
    for role, stage, data in results:
        if "error" not in data and data.get("value") is None:
            shown = f" {data['text']!r}" if data.get("text") else ""
            return (f"For {describe(reference, role, stage)} your function returned a {data.get('type')}{shown}: "
                    "return the bytes as an int or a float, and format them only when you print.")
    failed = [data["error"] for _, _, data in results if "error" in data]
    if len(failed) == len(results):
        return f"Your function raised {failed[0]} in every case."
    return None


def check_stage(stage):
    def test(student, reference):
        return compare(student, reference, ["even", "fp32_grads", "world_1", "huge"], [stage])
    return test


def check_exact(student, reference):
    return compare(student, reference, ["odd_small", "odd_large", "odd_layout"], STAGES)


def check_layout(student, reference):
    return compare(student, reference, ["fp32_adam", "fp32_grads", "odd_layout"], STAGES)


def check_invalid(student, reference):
    for stage in case(reference, "invalid")["stages"]:
        data = call(student, reference, "invalid", stage)
        if data.get("not_done"):
            raise ScenarioError(NOT_DONE)
        if not data.get("value_error"):
            did = f"raised {data['error']}" if "error" in data else f"returned {data.get('value')!r}"
            return (f"With stage={stage} your function {did}; raise ValueError for a stage outside 0-3, so a typo "
                    "cannot silently give a wrong plan.")
    return None


# Where a check that reads types or exceptions, or public numbers (the paper's), finds its evidence: a held-out case.
EVIDENCE = ("even",)
