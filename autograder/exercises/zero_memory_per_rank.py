"""Lesson 5 exercise: ``zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12))``.

Bytes of model state (weights, gradients, optimizer state) one rank holds under ZeRO stage
0–3, as an exact real number: the ZeRO paper divides exactly (7.5 B parameters on 64 ranks,
stage 1: 4Ψ + 12Ψ/64 = 31.4 GB). A stage outside 0–3 raises ValueError.

``observe`` calls the function on the paper's example and on hidden cases (odd world sizes,
world size 1, other byte layouts, invalid stages) and keeps only numbers and exception names.
"""
import numbers
from itertools import combinations

from ..exercise import NOT_DONE, Check, Exercise, ScenarioError

PAPER = (7_500_000_000, 64)
BUFFERS = ("weights", "gradients", "optimizer state")
DEFAULT = (2, 2, 12)
SHARDED = {0: (), 1: (2,), 2: (1, 2), 3: (0, 1, 2)}  # which of the three buffers each stage divides by N

# name: (num_params, world_size, bytes_per_param or None for the default); every stage 0-3 is called.
CASES = {
    "paper": (*PAPER, None),
    "mixed_even": (10_000_000, 8, None),
    "odd_7": (1000, 7, None),
    "odd_3": (1_000_001, 3, None),
    "odd_5_fp32_grads": (12_345, 5, (2, 4, 12)),
    "fp32_grads": (24_000_000, 16, (2, 4, 12)),
    "fp32_adam": (3_000_000, 6, (4, 4, 8)),
    "world_1": (123_457, 1, None),
    "huge": (175_000_000_000, 1024, (2, 4, 12)),
}
INVALID = {"stage_4": (1000, 4, 4), "stage_minus_1": (1000, 4, -1)}
RTOL = 1e-9  # exact arithmetic up to float round-off


# ---- observing -----------------------------------------------------------------------------

def _describe(exc: BaseException) -> str:
    return (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)[:300]


def _call(fn, args, bytes_per_param):
    try:
        value = fn(*args) if bytes_per_param is None else fn(*args, bytes_per_param=bytes_per_param)
    except Exception as exc:
        return {"error": _describe(exc), "value_error": isinstance(exc, ValueError),
                "not_done": isinstance(exc, NotImplementedError)}
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            return {"value": float(value), "type": type(value).__name__}
        except (TypeError, ValueError, OverflowError):
            pass
    return {"value": None, "type": type(value).__name__, "text": str(value)[:40] if isinstance(value, str) else ""}


def observe(fn) -> dict:
    results = {}
    for name, (n, world, layout) in CASES.items():
        for stage in range(4):
            results[f"{name}/{stage}"] = _call(fn, (n, world, stage), layout)
    for name, args in INVALID.items():
        results[name] = _call(fn, args, None)
    return {"results": results}


# ---- reading the observation -----------------------------------------------------------------

def _what(case, stage):
    n, world, layout = CASES[case]
    per = f", bytes_per_param={layout}" if layout else ""
    return f"num_params={n:,}, world_size={world}, stage={stage}{per}"


def value(student, case, stage):
    data = student.get("results", {}).get(f"{case}/{stage}")
    if data is None:
        raise ScenarioError(f"No result for {_what(case, stage)}: the grader's observation is incomplete.")
    if "error" in data:
        if data.get("not_done"):
            raise ScenarioError(NOT_DONE)
        raise ScenarioError(f"Your function raised {data['error']} for {_what(case, stage)}.")
    if data.get("value") is None:
        raise ScenarioError(f"For {_what(case, stage)} your function returned a {data.get('type')}"
                            f"{' ' + repr(data['text']) if data.get('text') else ''}, not a number of bytes.")
    return data["value"]


def _close(got, want):
    return abs(got - want) <= RTOL * abs(want) + 1e-6


def _bytes(case, subset, layout=None):
    """Bytes per rank for `case` when the buffers in `subset` are divided by the world size."""
    n, world, own_layout = CASES[case]
    b = layout or own_layout or DEFAULT
    return sum(b[i] * n / (world if i in subset else 1) for i in range(3))


def _which_sharded(got, case):
    """The set of buffers the student's value divides by N, if one explains it exactly."""
    for k in range(4):
        for subset in combinations(range(3), k):
            if _close(got, _bytes(case, subset)):
                return subset
    return None


def _names(indices):
    return " and ".join(BUFFERS[i] for i in indices) if indices else "nothing"


def compare(student, reference, cases, stages):
    """None, or a sentence about the first (case, stage) where the student's bytes differ."""
    for case in cases:
        for stage in stages:
            got, want = value(student, case, stage), value(reference, case, stage)
            if _close(got, want):
                continue
            n, world, layout = CASES[case]
            message = f"For {_what(case, stage)} you return {got:,.1f} bytes, expected {want:,.1f}"
            if abs(got - want) <= sum(layout or DEFAULT) + 1:
                return message + ": a rounding difference; keep the exact quotient (use /, not // or rounding)."
            if layout and _close(got, _bytes(case, SHARDED[stage], DEFAULT)):
                return message + ": that is what the default (2, 2, 12) gives; use the bytes_per_param argument."
            subset = _which_sharded(got, case) if world > 1 else None
            if subset is not None:
                return (f"{message}: your value divides {_names(subset)} by world_size, but stage {stage} "
                        f"divides {_names(SHARDED[stage])}.")
            return message + "."
    return None


# ---- the checks ----------------------------------------------------------------------------

def check_paper(student, reference):
    for stage in range(4):
        got, want = value(student, "paper", stage), value(reference, "paper", stage)
        if _close(got * 1e9, want) or _close(got * 2**30, want):
            return ("You return gigabytes; return bytes (the paper's 31.4 GB is 31,406,250,000 bytes) and convert "
                    "only when you print.")
    problem = compare(student, reference, ["paper"], range(4))
    return problem and problem.replace("For num_params", "In the paper's example, num_params", 1)


def check_number(student, reference):
    valid = [(key, data) for key, data in (student.get("results") or {}).items() if key not in INVALID]
    if not valid:
        raise ScenarioError("No results: the grader's observation is incomplete.")
    if any(data.get("not_done") for _, data in valid):
        raise ScenarioError(NOT_DONE)
    for key, data in valid:
        if "error" not in data and data.get("value") is None:
            case, stage = key.split("/")
            shown = f" {data['text']!r}" if data.get("text") else ""
            return (f"For {_what(case, int(stage))} your function returned a {data.get('type')}{shown}: return the "
                    "bytes as an int or a float, and format them only when you print.")
    failed = [data["error"] for _, data in valid if "error" in data]
    if len(failed) == len(valid):
        return f"Your function raised {failed[0]} in every case."
    return None


def check_stage(stage):
    def test(student, reference):
        return compare(student, reference, ["mixed_even", "fp32_grads", "world_1", "huge"], [stage])
    return test


def check_exact(student, reference):
    return compare(student, reference, ["odd_7", "odd_3", "odd_5_fp32_grads"], range(4))


def check_layout(student, reference):
    return compare(student, reference, ["fp32_adam", "fp32_grads", "odd_5_fp32_grads"], range(4))


def check_invalid(student, reference):
    for name, (_, _, stage) in INVALID.items():
        data = student.get("results", {}).get(name)
        if data is None:
            raise ScenarioError("No result for an invalid stage: the grader's observation is incomplete.")
        if data.get("not_done"):
            raise ScenarioError(NOT_DONE)
        if not data.get("value_error"):
            did = f"raised {data['error']}" if "error" in data else f"returned {data.get('value')!r}"
            return (f"With stage={stage} your function {did}; raise ValueError for a stage outside 0-3, so a typo "
                    "cannot silently give a wrong plan.")
    return None


EXERCISE = Exercise(
    name="zero_memory_per_rank",
    notebook="05_fsdp_zero.ipynb",
    observe=observe,
    timeout_s=30,
    checks=[
        Check("Reproduces the ZeRO paper's example: 120 / 31.4 / 16.6 / 1.88 GB per rank", 2, check_paper),
        Check("Returns the bytes as a number", 1, check_number),
        Check("Stage 0 (plain data parallel) divides nothing by the world size", 1, check_stage(0)),
        Check("Stage 1 shards only the optimizer state", 1, check_stage(1)),
        Check("Stage 2 shards gradients and optimizer state, not the weights", 1, check_stage(2)),
        Check("Stage 3 shards weights, gradients and optimizer state", 1, check_stage(3)),
        Check("Divides exactly when the world size does not divide the bytes (odd world sizes)", 1, check_exact),
        Check("Uses bytes_per_param for weights, gradients and optimizer state", 1, check_layout),
        Check("Rejects a stage outside 0-3 with ValueError", 1, check_invalid),
    ],
)
