"""The checks of ``FusedLayerNorm``: plain Python on the observations (no torch here)."""
import math
from functools import partial

from ..judging.checking import advice, case, guarded_values_problem, parallel, scenario, what
from .cases import BF16_RTOL, EVIDENCE_MIN_COS, FP32_RTOL, SENTINEL, STATS_RTOL

KERNEL_SCENARIOS = ("forward", "backward", "short_rows", "bf16")
WORDS = {"y": "y", "mean": "the mean", "rstd": "rstd", "dx": "dx", "dw": "the rows' shares of dw",
         "db": "the rows' shares of db"}


values_problem = partial(guarded_values_problem, words=WORDS, sentinel=SENTINEL)


def check_forward(student, reference):
    return advice(values_problem(student, reference, "forward", ("mean", "rstd", "y"), FP32_RTOL),
                  "walk each row in chunks of BLOCK (starting at 0, BLOCK, 2·BLOCK, … below n_cols), sum x for the mean, "
                  "then (x − mean)² "
                  "for the variance, and store y = (x − mean)·rstd·w + b with rstd = 1/√(variance + eps).")


def check_backward(student, reference):
    return advice(values_problem(student, reference, "backward", ("dx", "dw", "db"), FP32_RTOL),
                  "with x̂ = (x − mean)·rstd and g = dy·w, dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), both means over the "
                  "whole row (a first pass over its chunks), and store dy·x̂ and dy as the row's shares of dw and db.")


def check_masks(student, reference):
    for key in KERNEL_SCENARIOS:
        got = scenario(student, key, what(reference, key))
        outside = [name for name, intact in got["guards"].items() if not intact]
        if outside:
            return (f"When {what(reference, key)}, your kernels wrote outside the tensors ({', '.join(outside)}): "
                    "mask every tl.store (and tl.load) of a row's last, shorter chunk with cols < n_cols.")
    for key in KERNEL_SCENARIOS:
        got, want = scenario(student, key, what(reference, key)), reference["scenarios"][key]["truth"]
        nan = [WORDS[name] for name in want if any(not math.isfinite(float(v)) for v in got[name])]
        if nan:
            return (f"When {what(reference, key)}, {nan[0]} holds NaN where the truth is finite: the grader puts NaN "
                    "past the end of every input, so a load reads past a row: mask it with cols < n_cols, other=0.0.")
    return advice(values_problem(student, reference, "short_rows", ("mean", "rstd", "y", "dx", "dw", "db"),
                                 FP32_RTOL),
                  "with BLOCK longer than the row, the one chunk is partly outside it: mask the loads (other=0.0) and "
                  "leave the masked lanes out of the sums, (x − mean)² included.")


def check_bf16(student, reference):
    problem = values_problem(student, reference, "bf16", ("mean", "rstd"), STATS_RTOL)
    if problem:
        return (f"{problem}: compute the statistics in float32 (cast each loaded chunk with .to(tl.float32) and keep "
                "the sums in float32 accumulators); a bfloat16 sum of a row keeps about 3 significant digits.")
    return advice(values_problem(student, reference, "bf16", ("y", "dx", "dw", "db"), BF16_RTOL),
                  "compute in float32 and cast only the stored y and dx to the output's dtype "
                  "(.to(y_ptr.dtype.element_ty)).")


def check_function(student, reference):
    c = case(reference, "function")
    return advice(values_problem(student, reference, "function", ("y", "dx", "dw", "db"), FP32_RTOL),
                  f"flatten x to ({math.prod(c['lead'])}, {c['cols']}) rows, launch one program per row with a "
                  "power-of-two BLOCK, save x, w, mean and rstd, and return dw and db as the sums of the rows' "
                  "shares, and dx shaped like x.")


def rows_but_last(values, c: dict):
    return values[:(c["rows"] - 1) * c["cols"]] if isinstance(values, list) else values


def kernels_ran(got: dict, want: dict) -> str | None:
    """The evidence for the mask check: every row but the last of y (forward) or dx (backward) points where the
    truth does, which only a kernel that really normalised the grader's seeded rows shows (a kernel that does
    nothing leaves the grader's marker). The last row is left out: a missing mask spoils it, and that is the check's
    own verdict."""
    c = want["case"]
    name = "y" if "y" in want["truth"] else "dx"
    mine, truth = rows_but_last(got.get(name), c), rows_but_last(want["truth"][name], c)
    if isinstance(mine, list) and SENTINEL not in mine and parallel(mine, truth, min_cos=EVIDENCE_MIN_COS):
        return None
    return f"when {c['what']}, {name} is not LayerNorm's, even away from the last row."
