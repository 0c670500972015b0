"""The known mistakes of ``FusedLayerNorm`` and their fingerprints in the observations (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/fused_layer_norm.py
(tests/exercises/test_diagnosis.py). The kernel scenarios tell most: the grader's own launches, with guards around every
buffer (``guards``: which are intact) and outputs pre-filled with a marker; the backward launch gets the true
statistics, so a backward mistake shows whatever the forward does.
"""
import math

from ..judging.checking import relative_error
from ..judging.diagnosis import EVERY, Mistake, ran
from ..judging.localise import Locate
from .cases import FP32_RTOL, SENTINEL, STATS_RTOL
from .checks import KERNEL_SCENARIOS


def _right(student, reference, key, *names, rtol=FP32_RTOL) -> bool:
    got, want = ran(student, key), reference["scenarios"][key]["truth"]
    return all(relative_error(got[name], want[name]) <= rtol for name in names)


def _rows(values: list, cols: int) -> list[list]:
    return [values[i:i + cols] for i in range(0, len(values), cols)]


def backward_without_the_mean_term(student, reference):
    """LayerNorm's dx sums to zero along each row; without the r·mean(g) term it is off by that constant per row."""
    c, got = reference["scenarios"]["backward"]["case"], ran(student, "backward")["dx"]
    want = reference["scenarios"]["backward"]["truth"]["dx"]
    if _right(student, reference, "backward", "dx"):
        return None
    centred = [v - sum(row) / len(row) for row in _rows([float(v) for v in got], c["cols"]) for v in row]
    if relative_error(centred, want) <= 1e-4:
        return "the backward kernel's dx is off by a constant along each row, and with each row's mean taken out it is right"
    return None


def statistics_in_bfloat16(student, reference):
    if _right(student, reference, "forward", "mean", "rstd") and \
            not _right(student, reference, "bf16", "mean", "rstd", rtol=STATS_RTOL):
        return "the statistics of float32 rows are right, those of bfloat16 rows are not"
    return None


def no_mask_on_the_last_block(student, reference):
    for key in KERNEL_SCENARIOS:
        try:
            got = ran(student, key)
        except KeyError:
            continue
        outside = [name for name, intact in got["guards"].items() if not intact]
        if outside:
            return f"your kernels wrote past the end of a tensor into the grader's guard ({', '.join(outside)})"
        for name in reference["scenarios"][key]["truth"]:
            values = [float(v) for v in got[name]]
            if any(math.isnan(v) for v in values) and not all(math.isnan(v) for v in values):
                return f"the grader's NaN past the end of an input reached {name}: a load read past a row"
    return None


def grid_covers_only_the_first_rows(student, reference):
    c = reference["scenarios"]["function"]["case"]
    if not _right(student, reference, "forward", "y"):
        return None
    got, want = ran(student, "function")["y"], reference["scenarios"]["function"]["truth"]["y"]
    right = [relative_error(g, w) <= 1e-4 for g, w in zip(_rows(got, c["cols"]), _rows(want, c["cols"]))]
    first = right.index(False) if False in right else len(right)
    if 0 < first < len(right) and not any(right[first:]):
        return (f"your kernels are right when the grader launches them, but your Function's y is right only on its "
                f"first {first} of {len(right)} rows")
    return None


def one_chunk_per_row_ignoring_block(student, reference):
    if _right(student, reference, "short_rows", "mean", "rstd", "y") and \
            not _right(student, reference, "forward", "mean"):
        return "with BLOCK longer than a row the forward kernel is right; with rows longer than BLOCK its mean is not"
    return None


def does_nothing(student, reference):
    if all(float(v) == SENTINEL for v in ran(student, "forward")["y"]) and \
            all(float(v) == SENTINEL for v in ran(student, "backward")["dx"]):
        return "your kernels stored nothing: y and dx still hold the grader's marker"
    return None


MISTAKES = [
    Mistake("backward_without_the_mean_term", "Your backward leaves out the mean term, −mean(g), of dx.",
            "LayerNorm subtracts each row's mean, which depends on every x_j: its backward takes the mean of g out "
            "again (RMSNorm's has no such term).",
            "Sum g = dy·w over the row in the first pass and subtract mean(g) in dx, as in the lesson's formula.",
            backward_without_the_mean_term),
    Mistake("statistics_in_bfloat16", "Your forward computes or keeps the mean and rstd in bfloat16.",
            "bfloat16 has 8 bits of mantissa: a row's sum or its statistics lose most of their digits.",
            "Load each chunk with .to(tl.float32), keep float32 accumulators and statistics, and cast only what "
            "you store in y.", statistics_in_bfloat16, variants=("bfloat16_accumulators",)),
    Mistake("no_mask_on_the_last_block", "Some loads or stores of your kernels have no mask.",
            "A row's last chunk runs past its end when its length is not a multiple of BLOCK: the kernel reads "
            "the next row or memory that is no tensor's, and writes there.",
            "Give every tl.load and tl.store mask=cols < n_cols (loads with other=0.0).", no_mask_on_the_last_block),
    Mistake("grid_covers_only_the_first_rows", "Your Function launches fewer programs than there are rows.",
            "Each program normalises one row: rows past the grid are never computed.",
            "Launch the kernels on the grid (rows,), one program per row of x flattened to (rows, n).",
            grid_covers_only_the_first_rows),
    Mistake("one_chunk_per_row_ignoring_block", "Your kernels handle only the first BLOCK elements of each row.",
            "The grader's BLOCK may be shorter than a row: the rest of the row is never read or written.",
            "Loop over the row in chunks of BLOCK, starting at 0, BLOCK, 2·BLOCK, … while below n_cols.",
            one_chunk_per_row_ignoring_block),
    Mistake("does_nothing", "Your kernels store nothing.", "The grader reads y, mean, rstd, dx and the shares from "
            "the buffers it passes them.", "Write the kernels as the exercise describes.", does_nothing,
            includes=EVERY),
]


def deduce(wrong: frozenset, right: frozenset) -> str:
    """What the right results rule out: y needs mean and rstd; dx, dw and db need x̂ (from mean and rstd) and dy."""
    stats = {"mean", "rstd"}
    if "y" in wrong and stats <= right:
        return "mean and rstd are right: the error is in how y is made from them (x̂·w + b, or where it is stored)."
    if wrong & stats == {"rstd"} and "mean" in right:
        return "mean is right but rstd is not: the error is in the variance (1/√(mean of (x − mean)² + eps))."
    if "dx" in wrong and {"y", "dw", "db"} <= right:
        return ("y, dw and db are right, so x̂ and dy reach the backward right: the error is in dx's own formula "
                "(rstd·(w·dy − the mean of w·dy − x̂ · the mean of w·dy·x̂)).")
    if wrong & {"dw", "db"} == {"dw"} and {"y", "dx", "db"} <= right:
        return "y, dx and db are right: the error is in dw's own terms (dy·x̂ in each row, summed over the rows)."
    if wrong & {"dw", "db"} == {"db"} and {"y", "dx", "dw"} <= right:
        return "y, dx and dw are right: the error is in db's own terms (dy in each row, summed over the rows)."
    if wrong & {"dw", "db"} and {"y", "dx"} <= right:
        return "y and dx are right: the error is in how dw and db are summed over the rows."
    return ""


def _rows_of(case: dict) -> tuple[int, int, str]:
    return (case["rows"] if "rows" in case else math.prod(case["lead"])), case["cols"], "row"


# What the values are called in the exercise; the shares of dw and db are (rows, n) in the kernel scenarios.
LOCATE = Locate(names={"y": "y", "mean": "mean", "rstd": "rstd", "dx": "dx", "dw": "dw", "db": "db"},
                ignore=("guards",),
                tolerance=lambda case: FP32_RTOL * 10 if case["dtype"] == "float32" else 3e-2,
                rows={"y": _rows_of, "dx": _rows_of}, deduce=deduce)
