"""The known mistakes of ``FlashAttention`` and their fingerprints in the observations (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/flash_attention.py
(tests/exercises/test_diagnosis.py). Each scenario records o, dq, dk, dv and their dtypes (the reference's carries attention's
own values, ``truth``); the memory scenario also what forward saved, the largest tensor made and the peak measured
from outside. Causal rows tell a lot: query row 1 sees two keys, both in the first tile of any tiling, so a mistake
in combining tiles leaves it right while a mistake in every tile's arithmetic does not.
"""
import math

from ..judging.checking import relative_error
from ..judging.diagnosis import EVERY, Mistake, error_of, ran
from ..judging.localise import Locate
from .checks import FP32_RTOL
from .checks import _largest_saved as largest_saved


def _error(student, reference, key, name="output") -> float:
    return relative_error(ran(student, key)[name], reference["scenarios"][key]["truth"][name])


def _right(student, reference, key, *names) -> bool:
    return all(_error(student, reference, key, name) <= FP32_RTOL for name in names or ("output",))


def _row_right(student, reference, key, name, row) -> bool:
    """Row ``row`` of the first head of ``name`` equals attention's."""
    d = reference["scenarios"][key]["case"]["d"]
    got, want = ran(student, key)[name], reference["scenarios"][key]["truth"][name]
    part, truth = got[row * d:(row + 1) * d], want[row * d:(row + 1) * d]
    return relative_error(part, truth) <= 1e-4


def _finite(values) -> bool:
    return all(math.isfinite(float(v)) for v in values)


def no_rescaling(student, reference):
    if not _right(student, reference, "plain") and _row_right(student, reference, "causal", "output", 1) \
            and _finite(ran(student, "causal")["output"]):
        return ("causal rows whose keys all sit in one tile are right, the others are not: the tiles are combined "
                "without rescaling")
    return None


def missing_scale(student, reference):
    if not _right(student, reference, "plain") and not _row_right(student, reference, "causal", "output", 1) \
            and _finite(ran(student, "plain")["output"]):
        return "even a causal row that sees only two keys is wrong: every score is off, not only the tiles' merging"
    return None


def causal_mask_off_by_one(student, reference):
    if _right(student, reference, "plain") and not _finite(ran(student, "causal")["output"]):
        return "not causal the output is right; causal, some rows are not finite (a row that sees no key at all)"
    return None


def no_max_subtraction(student, reference):
    if _right(student, reference, "plain") and not _finite(ran(student, "large_logits")["output"]):
        return "with scores near 100 the output is not finite: exp overflowed float32"
    return None


def last_partial_tile_dropped(student, reference):
    if _right(student, reference, "plain", "output", "dq", "dk", "dv") and not _right(student, reference, "ragged"):
        return "with lengths a multiple of the tile everything is right; with a shorter last tile the output is not"
    return None


def D_summed_over_one_key_tile(student, reference):  # noqa: N802 (the variant's name)
    if _right(student, reference, "plain") and not _right(student, reference, "plain", "dq") \
            and _row_right(student, reference, "causal", "dq", 1):
        return ("the output is right, and dq is right on causal rows whose keys sit in one tile, wrong elsewhere: "
                "D summed over one key tile, not the whole row")
    return None


def L_saved_as_max_only(student, reference):  # noqa: N802 (the variant's name)
    if _right(student, reference, "plain") and not _right(student, reference, "plain", "dq") \
            and not _row_right(student, reference, "causal", "dq", 1):
        return "the output is right and every gradient is wrong, even on a causal row that sees two keys"
    return None


def every_gradient_wrong(student, reference) -> bool:
    """An unnormalised P spoils dv as well as dq and dk, and, L being too small by log l ≥ 0, makes every row of P
    (so dv = Pᵀ dO) larger, never smaller: a finite dv larger in size than attention's."""
    got, want = ran(student, "plain")["dv"], reference["scenarios"]["plain"]["truth"]["dv"]
    return (not _right(student, reference, "plain", "dk") and not _right(student, reference, "plain", "dv")
            and _finite(got) and sum(abs(x) for x in got) > sum(abs(x) for x in want))


def dv_right(student, reference) -> bool:
    """D enters dS only: dv, computed from P alone, stays right."""
    return _right(student, reference, "plain", "dv")


def float32_output_for_bf16(student, reference):
    dtypes = ran(student, "bf16")["dtypes"]
    if dtypes.get("output") == "float32":
        return "with bfloat16 inputs the output came back as float32"
    return None


def saves_P_for_backward(student, reference):  # noqa: N802 (the variant's name)
    c = reference["scenarios"]["memory"]["case"]
    if largest_saved(ran(student, "memory")) * 2 > c["n_q"] * c["n_k"]:
        return "with 2048 queries and keys, forward saved an n_q × n_k tensor for backward"
    return None


def backward_through_naive_attention(student, reference):
    got, c = ran(student, "memory"), reference["scenarios"]["memory"]["case"]
    if largest_saved(got) * 2 <= c["n_q"] * c["n_k"] < 2 * int(got["largest_tensor"]) \
            and _right(student, reference, "plain", "output", "dq"):
        return "the values are right and forward saved no n_q × n_k tensor, but an n_q × n_k tensor was made"
    return None


def calls_torch_sdpa(student, reference):
    if ran(student, "memory").get("forbidden"):
        return "your FlashAttention called torch's scaled_dot_product_attention"
    return None


def returns_zeros(student, reference):
    if "as None" in error_of(student, "plain"):
        return "backward returned None for some gradients"
    return None


MISTAKES = [
    Mistake("no_rescaling", "You add each tile's exp-scores to the accumulator without rescaling it when the running "
            "max grows.", "Earlier tiles were exponentiated against an older, smaller max: their weights are then too "
            "large by exp(new max − old max).",
            "Multiply the accumulator (and the running sum) by exp(old max − new max) before adding a tile.",
            no_rescaling, variants=("no_rescaling", "no_rescaling_in_whole_row_tiles")),
    Mistake("missing_scale", "You do not scale the scores by 1/√d.", "Attention is softmax(q kᵀ / √d) v.",
            "Multiply q kᵀ by 1/math.sqrt(d) in forward, and in the backward's recomputed tiles and dq, dk.",
            missing_scale),
    Mistake("causal_mask_off_by_one", "Your causal mask hides the diagonal (j ≥ i instead of j > i).",
            "Query i sees key i too; the first query then sees no key at all and its softmax is NaN.",
            "Mask the scores where j > i.", causal_mask_off_by_one),
    Mistake("no_max_subtraction", "You exponentiate the scores without subtracting the running max.",
            "exp of a score near 100 overflows float32 to inf.", "Use exp(s − m) with m the running max per query.",
            no_max_subtraction),
    Mistake("last_partial_tile_dropped", "Your loops stop before the last, shorter tile.",
            "When a length is not a multiple of the tile size, the last rows or keys are never computed.",
            "Loop with range(0, n, BLOCK) and slice each tile to what is left.", last_partial_tile_dropped),
    Mistake("d_summed_over_one_key_tile", "You compute D = rowsum(dP ∘ P) inside each key tile.",
            "D must be the sum over the whole row of keys; per tile it is only part of it.",
            "Use D = rowsum(dO ∘ O) once per query row, before the tile loop.", D_summed_over_one_key_tile,
            requires=dv_right,
            variants=("D_summed_over_one_key_tile",)),
    Mistake("l_saved_as_max_only", "You save the running max as L, without log of the running sum.",
            "Backward recomputes P = exp(S − L): with L = max only, P is not normalised.",
            "Save L = m + log(l).", L_saved_as_max_only, variants=("L_saved_as_max_only",),
            requires=every_gradient_wrong),
    Mistake("float32_output_for_bf16", "You return float32 results for bfloat16 inputs.",
            "The contract returns o and the gradients in the inputs' dtype.",
            "Compute in float32, then cast o and dq, dk, dv to the inputs' dtypes.", float32_output_for_bf16),
    Mistake("saves_p_for_backward", "Your forward saves the probabilities P (n_q × n_k) for backward.",
            "That is the memory FlashAttention exists to avoid: backward recomputes each tile of P from q, k and L.",
            "Save only q, k, v, o and L; recompute P tile by tile in backward.", saves_P_for_backward,
            variants=("saves_P_for_backward",)),
    Mistake("backward_through_naive_attention", "Your backward recomputes full attention (n_q × n_k) and "
            "differentiates it.", "The values are right but the backward holds the whole score matrix.",
            "Write the tiled backward: per tile, recompute P from L, then dV, dP, dS = P ∘ (dP − D), dQ and dK.",
            backward_through_naive_attention),
    Mistake("calls_torch_sdpa", "You call torch's scaled_dot_product_attention.",
            "It does this exercise for you.", "Compute the tiles, the online softmax and the backward yourself.",
            calls_torch_sdpa, includes=EVERY),
    Mistake("returns_zeros", "Your backward returns no gradient for some inputs.",
            "dq, dk and dv must all come back.", "Return (dq, dk, dv, None) from backward.", returns_zeros,
            includes=EVERY),
]

# What the values are called in the exercise, and the factors a plausible mistake scales them by.
def deduce(wrong: frozenset, right: frozenset) -> str:
    """What the right results rule out, from the backward's dependencies: dv = pᵀ·dO needs p (from L), dq and dk
    both need ds = p ∘ (dp − D); a result right everywhere clears what it is computed from."""
    grads = {"dq", "dk", "dv"}
    if "o" not in right or not wrong & grads:
        return ""
    if wrong & grads == {"dk"} and {"dq", "dv"} <= right:
        return ("Only dk is wrong; o, dq and dv are right, so p, L, D and ds are too: the error is in dk's own sum "
                "(dsᵀ·q over the query tiles, its scale or which tiles it adds).")
    if wrong & grads == {"dq"} and {"dk", "dv"} <= right:
        return ("Only dq is wrong; o, dk and dv are right, so p, L, D and ds are too: the error is in dq's own sum "
                "(ds·k over the key tiles, its scale or which tiles it adds).")
    if wrong & grads == {"dv"} and {"dq", "dk"} <= right:
        return ("Only dv is wrong; o, dq and dk are right, so p and L are too: the error is in dv's own sum "
                "(pᵀ·dO over the query tiles, or which tiles it adds).")
    if wrong & grads == {"dq", "dk"} and "dv" in right:
        return ("dq and dk are wrong while o and dv are right, so p and L are right: the error is in what dq and dk "
                "share, ds = p ∘ (dp − D), that is in dp = dO·vᵀ or in D (the row sums of dO ∘ o).")
    if wrong & grads == grads:
        return ("o is right but dq, dk and dv are all wrong: the backward's p differs from the forward's (L as saved "
                "or used, the scale or the causal mask in the backward).")
    return ""


LOCATE = Locate(names={"output": "o", "dq": "dq", "dk": "dk", "dv": "dv", "dtypes": "the dtype of {}"},
                ignore=("saved", "largest_tensor", "forbidden"),
                factors=lambda case: {"√d": math.sqrt(case["d"]), "d": case["d"]},
                tolerance=lambda case: FP32_RTOL * 10 if case["dtype"] == "float32" else 3e-2,
                rows={"output": lambda case: (case["n_q"], case["d"], "query row"),
                      "dq": lambda case: (case["n_q"], case["d"], "query row"),
                      "dk": lambda case: (case["n_k"], case["d"], "key row"),
                      "dv": lambda case: (case["n_k"], case["d"], "key row")},
                deduce=deduce)
