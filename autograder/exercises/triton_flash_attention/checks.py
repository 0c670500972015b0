"""The checks of ``TritonFlashAttention``: plain Python on the observations (no torch here)."""
import math
from functools import partial

from ..judging.checking import advice, case, guarded_values_problem, parallel, scenario, what
from .cases import BF16_RTOL, EVIDENCE_MIN_COS, FP32_RTOL, GRAD_RTOL, SENTINEL, STATS_RTOL

KERNEL_SCENARIOS = ("full", "causal", "causal_tiles", "bf16")
WORDS = {"o": "o", "L": "L", "dq": "dq", "dk": "dk", "dv": "dv"}


values_problem = partial(guarded_values_problem, words=WORDS, sentinel=SENTINEL)


def check_full(student, reference):
    return advice(values_problem(student, reference, "full", ("o", "L"), FP32_RTOL),
                  "keep a running maximum m and sum ℓ per query row over the key tiles, rescale ℓ and the output by "
                  "exp(m_old − m_new) when m grows, store o = acc / ℓ and L = m + log ℓ.")


def check_causal(student, reference):
    return advice(values_problem(student, reference, "causal", ("o", "L"), FP32_RTOL),
                  "query row i sees keys 0..i, itself included: scores of keys j > i at −inf.")


def check_tiles(student, reference):
    return advice(values_problem(student, reference, "causal_tiles", ("o", "L"), FP32_RTOL),
                  "with CAUSAL, stop the loop over key tiles after the one that holds the query tile's last row: "
                  "no query of the tile sees a key after it.")


def check_masks(student, reference):
    for key in KERNEL_SCENARIOS:
        got = scenario(student, key, what(reference, key))
        outside = [name for name, intact in got["guards"].items() if not intact]
        if outside:
            return (f"When {what(reference, key)}, your kernel wrote outside the tensors ({', '.join(outside)}): "
                    "mask the stores of o and L with rows < n.")
    for key in ("full", "bf16"):
        got = scenario(student, key, what(reference, key))
        if any(not math.isfinite(float(v)) for name in ("o", "L") for v in got[name]):
            return (f"When {what(reference, key)}, o or L holds NaN: the grader puts NaN past the end of q, k and v, "
                    "so a load read past row n − 1: mask the loads of the last tiles with < n (other=0.0) and the "
                    "scores of keys ≥ n with −inf.")
    return None


def check_bf16(student, reference):
    problem = values_problem(student, reference, "bf16", ("L",), STATS_RTOL)
    if problem:
        return (f"{problem}: load q, k and v with .to(tl.float32) and keep m, ℓ and L in float32, as the exercise "
                "states (the grader's interpreter gets tl.dot of bfloat16 tiles wrong).")
    return advice(values_problem(student, reference, "bf16", ("o",), BF16_RTOL),
                  "compute in float32 and cast only the stored o to the output's dtype (.to(o_ptr.dtype.element_ty)).")


def check_function(student, reference):
    c = case(reference, "function")
    problem = values_problem(student, reference, "function", ("o",), FP32_RTOL)
    if problem:
        return (f"{problem}: view q, k, v {tuple(c['shape'])} as contiguous (batch·heads, n, d) and launch the grid "
                "(cdiv(n, BLOCK_M), batch·heads) with the call's CAUSAL.")
    return advice(values_problem(student, reference, "function", ("dq", "dk", "dv"), GRAD_RTOL),
                  "recompute P = exp(q kᵀ·scale − L) (causal mask included); dv = Pᵀ do, dS = P ⊙ (do vᵀ − "
                  "rowsum(do ⊙ o)), dq = dS k·scale, dk = dSᵀ q·scale.")


def _centred(values: list) -> list[float]:
    mean = sum(float(v) for v in values) / len(values)
    return [float(v) - mean for v in values]


def kernel_ran(got: dict, want: dict) -> str | None:
    """The evidence for the mask check: in the first query tile (16 rows of the first batch·head), o points where
    the truth does, or L does once each is centred (a constant L is not evidence), which only a kernel that really
    attended over the grader's seeded q, k, v shows (one that does nothing leaves the grader's marker). Either is
    enough, so that a mistake in o alone or in L alone costs its own checks, not this one. The last tiles are left
    out: a missing mask spoils them, and that is the check's own verdict."""
    c = want["case"]
    rows = 16
    for name, width in (("o", c["d"]), ("L", 1)):
        mine, truth = got.get(name), want["truth"][name]
        if not isinstance(mine, list) or len(mine) != len(truth) or SENTINEL in mine[:rows * width]:
            continue
        mine, truth = mine[:rows * width], truth[:rows * width]
        if not all(math.isfinite(float(x)) for x in mine):
            continue
        if name == "L":
            mine, truth = _centred(mine), _centred(truth)
        if parallel(mine, truth, min_cos=EVIDENCE_MIN_COS):
            return None
    return f"when {c['what']}, neither o nor L is attention's, even in the first query tile."
