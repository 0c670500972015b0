"""The known mistakes of ``TritonFlashAttention`` and their fingerprints in the observations (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/triton_flash_attention.py
(tests/exercises/test_diagnosis.py). The reference's truth holds, besides attention in float64, what some mistakes compute
(``alternatives``: L with the scale applied twice, L without the maximum, o without the rescale, the causal L with
the diagonal left out), so that each is recognised by its values, not guessed from which checks failed.
"""
import math

from ..judging.checking import relative_error
from ..judging.diagnosis import EVERY, Mistake, ran
from ..judging.localise import Locate
from .cases import FP32_RTOL, SENTINEL
from .checks import KERNEL_SCENARIOS

MATCH = 1e-4  # a student's result equals a mistake's values (computed in float64) within this, normwise


def _right(student, reference, key, *names, rtol=FP32_RTOL) -> bool:
    got, want = ran(student, key), reference["scenarios"][key]["truth"]
    return all(relative_error(got[name], want[name]) <= rtol for name in names)


def _alternative(reference, key: str, name: str) -> list:
    return reference["scenarios"][key]["truth"]["alternatives"][name]


def no_rescale_of_the_output(student, reference):
    got = ran(student, "full")["o"]
    if not _right(student, reference, "full", "o") and \
            relative_error(got, _alternative(reference, "full", "o_without_rescale")) <= MATCH:
        return "without causal masking o equals an online softmax whose running output is never rescaled"
    return None


def logsumexp_without_the_max(student, reference):
    if _right(student, reference, "full", "o") and not _right(student, reference, "full", "L") and \
            relative_error(ran(student, "full")["L"], _alternative(reference, "full", "L_without_max")) <= MATCH:
        return "o is right and L equals log ℓ, the log-sum-exp less each row's maximum"
    return None


def causal_mask_off_by_one(student, reference):
    c = reference["scenarios"]["causal"]["case"]
    if not _right(student, reference, "full", "o", "L") or _right(student, reference, "causal", "L"):
        return None
    got, n = ran(student, "causal")["L"], c["n"]
    from_row_1 = [v for head in range(c["heads"]) for v in got[head * n + 1:(head + 1) * n]]
    if relative_error(from_row_1, _alternative(reference, "causal", "L_strict_from_row_1")) <= MATCH:
        return "the causal L of query row i is the log-sum-exp over keys 0..i − 1: the diagonal is masked out"
    return None


def no_mask_on_the_last_tile(student, reference):
    for key in KERNEL_SCENARIOS:
        try:
            got = ran(student, key)
        except KeyError:
            continue
        outside = [name for name, intact in got["guards"].items() if not intact]
        if outside:
            return f"your kernel wrote past the end of a tensor into the grader's guard ({', '.join(outside)})"
    for key in ("full", "bf16"):
        values = [float(v) for name in ("o", "L") for v in ran(student, key)[name]]
        if any(math.isnan(v) for v in values) and not all(math.isnan(v) for v in values):
            return "the grader's NaN past the end of k and v reached o: a load of the last key tile read past n"
    return None


def scale_applied_twice(student, reference):
    if relative_error(ran(student, "full")["L"], _alternative(reference, "full", "L_scale_twice")) <= MATCH:
        return "L equals the log-sum-exp of q kᵀ·scale²"
    return None


def causal_tiles_not_skipped(student, reference):
    if _right(student, reference, "causal", "o", "L") and not _right(student, reference, "causal_tiles", "o"):
        return ("the causal values are right, but NaN the grader put in keys past the diagonal tile reached o: "
                "your kernel loaded those tiles")
    return None


def grid_covers_only_the_first_batch_head(student, reference):
    c = reference["scenarios"]["function"]["case"]
    if not _right(student, reference, "full", "o"):
        return None
    got, want = ran(student, "function")["o"], reference["scenarios"]["function"]["truth"]["o"]
    one = c["shape"][2] * c["shape"][3]
    if relative_error(got[:one], want[:one]) <= FP32_RTOL and relative_error(got[one:], want[one:]) > 1e-2:
        return ("your kernel is right when the grader launches it, but your Function's o is right only for the "
                "first batch·head")
    return None


def does_nothing(student, reference):
    if all(float(v) == SENTINEL for v in ran(student, "full")["o"]):
        return "your kernel stored nothing: o still holds the grader's marker"
    return None


MISTAKES = [
    Mistake("no_rescale_of_the_output", "Your kernel rescales ℓ but not the running output when the maximum grows.",
            "What the output summed under an old maximum m is scaled by exp(−m); once m grows, that part must be "
            "multiplied by exp(m_old − m_new) like ℓ, or it counts too much.",
            "Multiply the accumulator by the same factor as ℓ before adding the new tile's P·V.",
            no_rescale_of_the_output),
    Mistake("logsumexp_without_the_max", "Your kernel stores log ℓ as L, without the running maximum.",
            "ℓ sums exp(s − m): the log-sum-exp of the row is m + log ℓ, and the backward recomputes P = exp(s − L).",
            "Store L = m + log ℓ.", logsumexp_without_the_max),
    Mistake("causal_mask_off_by_one", "Your causal mask hides the diagonal: query i sees keys 0..i − 1.",
            "A query attends to its own position; without it the first query sees no key at all (NaN).",
            "Keep the keys j ≤ i (j <= i, not j < i).", causal_mask_off_by_one),
    Mistake("no_mask_on_the_last_tile", "Some loads or stores of your kernel have no mask.",
            "When n is not a multiple of the block, the last query or key tile runs past the end: the kernel reads "
            "the next batch·head or memory that is no tensor's, and writes there.",
            "Mask every tl.load and tl.store of a tile with its row or key index < n, and the scores of keys ≥ n "
            "with −inf.", no_mask_on_the_last_tile, variants=("no_mask_on_the_last_key_tile",)),
    Mistake("scale_applied_twice", "Your kernel applies the scale 1/√d twice.",
            "softmax(q kᵀ/√d) scales each score once; twice makes the softmax flatter and L wrong.",
            "Multiply either q or the scores by scale, once.", scale_applied_twice),
    Mistake("causal_tiles_not_skipped", "Your causal kernel loads every key tile and only masks the scores.",
            "The key tiles after the diagonal hold no key a query of the tile may see: loading and multiplying "
            "them doubles the work of a causal kernel for the same values.",
            "Stop the loop over key tiles at the end of the query tile when CAUSAL.", causal_tiles_not_skipped),
    Mistake("grid_covers_only_the_first_batch_head", "Your Function launches programs for the first batch·head only.",
            "Each program owns one query tile of one batch·head: the grid's second dimension must cover them all.",
            "Launch the grid (cdiv(n, BLOCK_M), batch·heads).", grid_covers_only_the_first_batch_head),
    Mistake("does_nothing", "Your kernel stores nothing.", "The grader reads o and L from the buffers it passes.",
            "Write the kernel as the exercise describes.", does_nothing, includes=EVERY),
]


def _rows_of(case: dict) -> tuple[int, int, str]:
    n = case["shape"][2] if "shape" in case else case["n"]
    return n, case["d"], "query row"


LOCATE = Locate(names={"o": "o", "L": "L", "dq": "dq", "dk": "dk", "dv": "dv"},
                ignore=("guards",),
                factors=lambda case: {"√d": math.sqrt(case["d"])},
                tolerance=lambda case: FP32_RTOL * 10 if case["dtype"] == "float32" else 3e-2,
                rows={"o": _rows_of, "dq": _rows_of})
