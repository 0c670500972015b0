"""The checks of ``FlashAttention``: plain Python on the observations (no torch here)."""
import math

from ..judging.checking import ScenarioError, case, parallel, relative_error, scenario, sketch_error, what
from .cases import BF16_RTOL, EVIDENCE_RTOL, FP32_RTOL

SDPA = ("Your FlashAttention calls torch's scaled_dot_product_attention, which does this exercise for you: compute "
        "the tiles, the online softmax and the backward yourself, as the lesson asks, to earn the points.")


def data_of(student: dict, reference: dict, key: str) -> dict:
    """The scenario's data, or ScenarioError (also when torch's SDPA did the work in the memory scenario)."""
    memory = student.get("scenarios", {}).get("memory")
    if isinstance(memory, dict) and memory.get("forbidden"):
        raise ScenarioError(SDPA)
    return scenario(student, key, what(reference, key))


def values_problem(student, reference, key: str, names=("output",), *, rtol: float = FP32_RTOL) -> str | None:
    got, want = data_of(student, reference, key), reference["scenarios"][key]["truth"]
    words = {"output": "the output o", "dq": "dq", "dk": "dk", "dv": "dv"}
    for name in names:
        error = relative_error(got.get(name), want[name])
        if error > rtol:
            how = "is not finite (overflow?)" if error == math.inf and isinstance(got.get(name), list) and \
                len(got[name]) == len(want[name]) else f"is off by {error:.1e} (relative to its largest value)"
            return f"When {what(reference, key)}, {words[name]} {how}, more than the {rtol:.0e} allowed"
    return None


def advice(problem: str | None, hint: str) -> str | None:
    return None if problem is None else f"{problem}: {hint}"


def check_output(student, reference):
    return advice(values_problem(student, reference, "plain"),
                  "scale the scores by 1/√d, keep a running max and sum per query, and rescale the accumulator "
                  "by exp(old max − new max) whenever the max grows.")


def check_gradients(student, reference):
    return advice(values_problem(student, reference, "plain", ("dq", "dk", "dv")),
                  "recompute P = exp(S − L) per tile with L = max + log(sum), use D = rowsum(dO ∘ O) over the "
                  "whole row, and dS = P ∘ (dP − D), scaled by 1/√d for dq and dk.")


def check_ragged(student, reference):
    return advice(values_problem(student, reference, "ragged", ("output", "dq", "dk", "dv")),
                  "the last tile of queries or keys may be shorter than BLOCK_Q or BLOCK_K: include it, and "
                  "accept any leading dimensions (...).")


def check_causal(student, reference):
    return advice(values_problem(student, reference, "causal", ("output", "dq", "dk", "dv")),
                  "with is_causal=True query i sees keys j ≤ i (itself included): mask the scores where j > i "
                  "with −inf, in the forward and when recomputing tiles in the backward.")


def check_large_logits(student, reference):
    return advice(values_problem(student, reference, "large_logits", ("output", "dq", "dk", "dv")),
                  "exp of a score near 100 overflows float32: subtract the running max before exponentiating.")


def check_bf16(student, reference):
    got = data_of(student, reference, "bf16")
    dtypes = got.get("dtypes", {})
    wrong = sorted(name for name in ("output", "dq", "dk", "dv") if dtypes.get(name) != "bfloat16")
    if wrong:
        return (f"When {what(reference, 'bf16')}, {', '.join(wrong)} came back as "
                f"{dtypes.get(wrong[0])}, not bfloat16: compute in float32, then return o and the gradients in "
                "the inputs' dtype.")
    return advice(values_problem(student, reference, "bf16", ("output", "dq", "dk", "dv"), rtol=BF16_RTOL),
                  "compute every tile in float32 (cast q, k, v and dO up first) and cast only the results down.")


MIB = 1 << 20


def memory_data(student, reference) -> tuple[dict, dict, dict]:
    """The memory scenario: the student's record (made in their process: feedback only), the meter's measurement
    of that process (from outside it), and the reference's."""
    got = data_of(student, reference, "memory")
    return got, got["meter"], reference["scenarios"]["memory"]["meter"]


def memory_problem(student, reference) -> str | None:
    """Whether the process's peak memory over forward + backward, measured from outside it, stayed within half an
    n_q × n_k float32 matrix of the reference's; the words say what the student's own record shows."""
    got, meter, theirs = memory_data(student, reference)
    c = case(reference, "memory")
    matrix = 4 * c["n_q"] * c["n_k"]
    extra = meter["peak_bytes"][0] - theirs["peak_bytes"][0]
    if extra <= matrix / 2:
        return None
    why = ("forward saved an n_q × n_k tensor for backward" if _largest_saved(got) * 2 > c["n_q"] * c["n_k"] else
           "an operation made an n_q × n_k tensor" if int(got["largest_tensor"]) * 2 > c["n_q"] * c["n_k"] else
           "something held it")
    return (f"When {c['what']}, your function's process held {extra / MIB:.0f} MiB more than the reference's at its "
            f"peak, {extra / matrix:.1f} times an n_q × n_k float32 matrix ({why}): work tile by tile in both passes, "
            "save only q, k, v, o and L, and recompute each tile's probabilities in backward.")


def _largest_saved(got: dict) -> int:
    return max((math.prod(int(n) for n in shape) for shape, _, _ in got["saved"]), default=0)


def check_saved(student, reference):
    got, _, _ = memory_data(student, reference)
    c = case(reference, "memory")
    if not any(list(shape) == c["lead"] + [c["n_q"]] and dtype == "float32" for shape, dtype, _ in got["saved"]):
        return (f"When {c['what']}, forward saved no float32 tensor of shape (..., n_q) for backward: save L, the "
                "log-sum-exp of each query's scaled scores, with q, k, v and o.")
    return memory_problem(student, reference)  # what is saved, read in the student's process, needs the meter's word


def check_peak_memory(student, reference):
    return memory_problem(student, reference)


def memory_is_genuine(got: dict, want: dict) -> str | None:
    """The evidence for the memory checks: the scenario really computed attention, all of it: its output rows point
    where attention's do, the sketch of o (projections of every element, on vectors secret under a held-out salt) is
    near the reference's, and those of dq, dk and dv point the same way. A function that skips the work, or computes
    only some rows, cannot show it."""
    c = want["case"]
    output = got.get("output")
    if not (isinstance(output, list) and relative_error(output, want["truth"]["output"]) < EVIDENCE_RTOL):
        return f"when {c['what']}, its output is not attention's."
    sketches = got.get("sketch") if isinstance(got.get("sketch"), dict) else {}
    for name, theirs in want.get("sketch", {}).items():  # gradients at any scale: a wrong factor is a values mistake
        mine = sketches.get(name)
        if sketch_error(mine, theirs) >= EVIDENCE_RTOL if name == "output" else not parallel(mine, theirs, min_cos=0.9):
            return f"when {c['what']}, its {'o' if name == 'output' else name} is not attention's in every row."
    return None
