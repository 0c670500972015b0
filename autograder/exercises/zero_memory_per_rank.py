"""Lesson 5 exercise: ``zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12))``.

Bytes of model state (weights, gradients, optimizer state) one rank holds under ZeRO stage
0–3, as an exact real number: the ZeRO paper divides exactly (7.5 B parameters on 64 ranks,
stage 1: 4Ψ + 12Ψ/64 = 31.4 GB). A stage outside 0–3 raises ValueError.

``observe`` calls the function on the paper's example and on hidden cases (odd world sizes,
world size 1, other byte layouts, invalid stages) and keeps only numbers and exception names.
"""
from itertools import combinations

from ..exercise import (
    NOT_DONE,
    Check,
    Exercise,
    ScenarioError,
    case,
    describe_exception,
    held_out_rng,
    observation,
    off_by,
    plain,
    scenario,
)

PAPER = (7_500_000_000, 64)
BUFFERS = ("weights", "gradients", "optimizer state")
DEFAULT = (2, 2, 12)
SHARDED = {0: (), 1: (2,), 2: (1, 2), 3: (0, 1, 2)}  # which of the three buffers each stage divides by N
STAGES = range(4)

# The public scenarios: role: (num_params, world_size, bytes_per_param or None for the default). Each is called
# with every stage 0-3. Held-out scenarios keep the roles and draw new numbers (see held_out_cases).
CASES = {
    "paper": (*PAPER, None),
    "even": (10_000_000, 8, None),
    "odd_small": (1000, 7, None),
    "odd_large": (1_000_001, 3, None),
    "odd_layout": (12_345, 5, (2, 4, 12)),
    "fp32_grads": (24_000_000, 16, (2, 4, 12)),
    "fp32_adam": (3_000_000, 6, (4, 4, 8)),
    "world_1": (123_457, 1, None),
    "huge": (175_000_000_000, 1024, (2, 4, 12)),
}
INVALID = (1000, 4, (4, -1))  # num_params, world_size, stages outside 0-3
LAYOUTS = [(2, 4, 12), (4, 4, 8), (4, 4, 4), (2, 2, 8)]  # real ones besides the default: fp32 grads, Adam, SGD
RTOL = 1e-9  # exact arithmetic up to float round-off


def held_out_cases(salt: int) -> tuple[dict, tuple]:
    """Every role with new numbers for a non-zero salt (odd world sizes stay odd and do not divide num_params)."""
    rng = held_out_rng(salt, "zero_memory_per_rank")

    def odd(low, high):
        world = rng.choice([3, 5, 7, 9, 11, 13])
        return next(n for n in iter(lambda: rng.randrange(low, high), None) if n % world), world

    found = {
        "paper": (*PAPER, None),  # the paper's example is public by nature: its check's title quotes it
        "even": (rng.randrange(10**6, 10**8), rng.choice([2, 4, 8, 16, 32, 64]), None),
        "odd_small": (*odd(100, 10_000), None),
        "odd_large": (*odd(10**6, 10**7), None),
        "odd_layout": (*odd(10_000, 100_000), rng.choice(LAYOUTS)),
        "fp32_grads": (rng.randrange(10**6, 10**8), rng.choice([2, 4, 8, 16, 32]), (2, 4, 12)),
        "fp32_adam": (rng.randrange(10**6, 10**7), rng.choice([2, 4, 6, 8, 12]), (4, 4, 8)),
        "world_1": (rng.randrange(10_000, 10**6), 1, None),
        "huge": (rng.randrange(10, 1000) * 10**9, rng.choice([256, 512, 1024, 2048]), (2, 4, 12)),
    }
    return found, (rng.randrange(100, 10_000), rng.choice([2, 4, 8]), (rng.choice([4, 5, 7]), rng.choice([-1, -2])))


def cases(salt: int) -> dict[str, dict]:
    roles, (n, world, stages) = (CASES, INVALID) if salt == 0 else held_out_cases(salt)
    found = {role: {"what": f"called with {_what(n, world, layout)}", "num_params": n, "world_size": world,
                    "bytes_per_param": list(layout) if layout else None}
             for role, (n, world, layout) in roles.items()}
    found["invalid"] = {"what": f"called with an invalid stage ({_what(n, world)})", "num_params": n,
                        "world_size": world, "bytes_per_param": None, "stages": list(stages)}
    return found


def _what(n, world, layout=None, stage=None):
    return (f"num_params={n:,}, world_size={world}" + (f", stage={stage}" if stage is not None else "")
            + (f", bytes_per_param={tuple(layout)}" if layout else ""))


# ---- observing -----------------------------------------------------------------------------

def _call(fn, case, stage):
    args = (case["num_params"], case["world_size"], stage)
    layout = case["bytes_per_param"]
    try:
        value = fn(*args) if layout is None else fn(*args, bytes_per_param=tuple(layout))
    except Exception as exc:
        return {"error": describe_exception(exc), "value_error": isinstance(exc, ValueError),
                "not_done": isinstance(exc, NotImplementedError)}
    data = plain(value)
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return {"value": float(data), "type": type(value).__name__}
    return {"value": None, "type": type(value).__name__, "text": data if isinstance(data, str) else ""}


def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda case: {
        "calls": [_call(fn, case, stage) for stage in case.get("stages", STAGES)]})


# ---- reading the observation -----------------------------------------------------------------

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

EXERCISE = Exercise(
    name="zero_memory_per_rank",
    notebook="05_fsdp_zero.ipynb",
    observe=observe,
    evidence=some_bytes_right,
    timeout_s=30,
    checks=[
        Check("Reproduces the ZeRO paper's example: 120 / 31.4 / 16.6 / 1.88 GB per rank", 2, check_paper,
              evidence=EVIDENCE),
        Check("Returns the bytes as a number", 1, check_number, evidence=EVIDENCE),
        Check("Stage 0 (plain data parallel) divides nothing by the world size", 1, check_stage(0)),
        Check("Stage 1 shards only the optimizer state", 1, check_stage(1)),
        Check("Stage 2 shards gradients and optimizer state, not the weights", 1, check_stage(2)),
        Check("Stage 3 shards weights, gradients and optimizer state", 1, check_stage(3)),
        Check("Divides exactly when the world size does not divide the bytes (odd world sizes)", 1, check_exact),
        Check("Uses bytes_per_param for weights, gradients and optimizer state", 1, check_layout),
        Check("Rejects a stage outside 0-3 with ValueError", 1, check_invalid, evidence=EVIDENCE),
    ],
)
