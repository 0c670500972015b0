"""The known mistakes of ``average_gradients`` and their fingerprints in the ranks' records (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/average_gradients.py
(tests/exercises/test_diagnosis.py). Each rank records, per call, its gradients and parameters before and after the call.
"""
from ..judging.checking import DEADLOCK, close, flat, scale_factor
from ..judging.diagnosis import EVERY, Mistake, error_of, ran
from ..judging.localise import Locate
from .cases import GRAD_ATOL


def _ranks(student, key) -> list[dict]:
    ranks = ran(student, key)["ranks"]
    if not isinstance(ranks, list) or not ranks:
        raise KeyError(key)
    return ranks


def _first_call(student, key):
    """(before, after) flat gradients of every rank at the first call, and the mean over ranks of before."""
    ranks = _ranks(student, key)
    before = [flat(r["calls"][0]["grads_before"]) for r in ranks]
    after = [flat(r["calls"][0]["grads_after"]) for r in ranks]
    return before, after, [sum(v) / len(v) for v in zip(*before)]


def _near(a, b) -> bool:
    return close(a, b, atol=GRAD_ATOL, rtol=1e-4)


def _factor(student, reference, key) -> float | None:
    """c when every rank holds c × the average after the first call."""
    before, after, mean = _first_call(student, key)
    c = scale_factor(after[0], mean)
    if c is None or not all(_near(a, [c * m for m in mean]) for a in after):
        return None
    return c


def _n(reference, key) -> int:
    return reference["scenarios"][key]["case"]["world_size"]


def sums_without_dividing(student, reference):
    c2, c3 = _factor(student, reference, "two_ranks"), _factor(student, reference, "three_ranks")
    if c2 and c3 and abs(c2 - 2) < 1e-3 and abs(c3 - 3) < 1e-3:
        return "with 2 ranks every gradient is 2 × the average, with 3 ranks 3 ×: the sum, not divided"
    return None


def divides_twice(student, reference):
    c2, c3 = _factor(student, reference, "two_ranks"), _factor(student, reference, "three_ranks")
    if c2 and c3 and abs(c2 - 1 / 2) < 1e-4 and abs(c3 - 1 / 3) < 1e-4:
        return "with 2 ranks every gradient is 1/2 of the average, with 3 ranks 1/3: divided by the world size twice"
    return None


def _fixed_divisor(student, reference) -> float | None:
    """d when the sum over ranks is divided by the same d whatever the world size."""
    c2, c3 = _factor(student, reference, "two_ranks"), _factor(student, reference, "three_ranks")
    if not c2 or not c3:
        return None
    d2, d3 = 2 / c2, 3 / c3
    return d2 if abs(d2 - d3) < 1e-3 * d2 else None


def hard_coded_two(student, reference):
    d = _fixed_divisor(student, reference)
    if d and abs(d - 2) < 1e-3:
        return "with 3 ranks every gradient is 1.5 × the average: the sum was divided by 2"
    return None


def divides_by_a_constant(student, reference):
    d = _fixed_divisor(student, reference)
    if d and abs(d - 2) > 1e-3 and abs(d - 1) > 1e-3:
        return f"with 2 and with 3 ranks the sum over ranks was divided by {d:.3g}, not by the world size"
    return None


def broadcasts_rank_zero(student, reference):
    before, after, mean = _first_call(student, "two_ranks")
    if not _near(before[0], mean) and all(_near(a, before[0]) for a in after):
        return "after the call every rank holds rank 0's own gradient"
    return None


def reduces_to_rank_zero(student, reference):
    before, after, mean = _first_call(student, "two_ranks")
    if _near(after[0], mean) and not all(_near(a, mean) for a in after[1:]):
        return "after the call only rank 0 holds the average"
    return None


def others_hold_no_sum(student, reference) -> bool:
    """dist.reduce leaves the other ranks without the sum: ranks holding exactly world_size × the average summed
    with all_reduce and divided on rank 0 only (another mistake, with the same rank 0)."""
    before, after, mean = _first_call(student, "two_ranks")
    n = len(before)
    return not all(_near(a, [n * m for m in mean]) for a in after[1:])


def _grads_unchanged(student) -> bool:
    before, after, mean = _first_call(student, "two_ranks")
    return all(_near(a, b) for a, b in zip(after, before)) and not _near(before[0], mean)


def _params_changed(student, key="two_ranks") -> bool:
    return any(not close(c["params_after"], c["params_before"], atol=1e-7)
               for r in _ranks(student, key) for c in r["calls"])


def grads_unchanged(student, reference):
    if _grads_unchanged(student) and not _params_changed(student):
        return "after the call every rank still holds its own gradient"
    return None


def averages_parameters(student, reference):
    if _grads_unchanged(student) and _params_changed(student):
        return "the gradients are unchanged after the call, and the parameters changed"
    return None


def also_steps_the_parameters(student, reference):
    before, after, mean = _first_call(student, "two_ranks")
    if all(_near(a, mean) for a in after) and _params_changed(student):
        return "the gradients are averaged, and the parameters changed during the call too"
    return None


def crashes_on_missing_grad(student, reference):
    if "NoneType" in error_of(student, "no_grad_params") and not error_of(student, "two_ranks"):
        return "with parameters whose .grad is None your function raised an error about None"
    return None


def _no_grad_calls(student):
    return [r["calls"][0] for r in _ranks(student, "no_grad_params")]


def zero_fills_missing_grads(student, reference):
    calls = _no_grad_calls(student)
    if any(b is None and a is not None for c in calls for b, a in zip(c["grads_before"], c["grads_after"])):
        return "parameters that had no gradient have one after your function"
    return None


def stops_at_first_missing_grad(student, reference):
    calls = _no_grad_calls(student)
    first = calls[0]["grads_before"].index(None)
    changed = [any(c["grads_after"][i] is not None and not close(c["grads_after"][i], c["grads_before"][i], atol=0.0)
                   for c in calls) for i in range(len(calls[0]["grads_before"]))]
    later = [changed[i] for i in range(first + 1, len(changed)) if calls[0]["grads_before"][i] is not None]
    if any(changed[:first]) and later and not any(later):
        return "the gradients before the first parameter without one were averaged, none after it"
    return None


def deadlocks_rank_one(student, reference):
    if error_of(student, "two_ranks") == DEADLOCK:
        return "with 2 ranks, one rank waited in a collective that the other never called"
    return None


MISTAKES = [
    Mistake("sums_without_dividing", "You all-reduce the gradients but never divide by the world size.",
            "all_reduce sums; DDP's gradient is the average, so the step is world_size times too large.",
            "Divide each summed gradient by dist.get_world_size().", sums_without_dividing),
    Mistake("divides_twice", "You divide by the world size twice (before and after the all-reduce, or ReduceOp.AVG "
            "and a division).", "The gradient then is the average divided by the world size once more.",
            "Divide exactly once.", divides_twice),
    Mistake("hard_coded_two", "You divide by 2 instead of by the world size.",
            "With 2 ranks that is right by chance; with any other number of ranks it is not.",
            "Divide by dist.get_world_size().", hard_coded_two),
    Mistake("divides_by_a_constant", "You divide the sum by a number that is not the world size.",
            "The average over ranks divides by the number of ranks, whatever the model looks like.",
            "Divide by dist.get_world_size().", divides_by_a_constant, variants=("divides_by_number_of_parameters",)),
    Mistake("broadcasts_rank_zero", "You broadcast rank 0's gradients instead of averaging.",
            "Every rank then steps with rank 0's micro-batch only: the other ranks' data is thrown away.",
            "Use dist.all_reduce and divide by the world size.", broadcasts_rank_zero),
    Mistake("reduces_to_rank_zero", "You use dist.reduce, which leaves the result on rank 0 only.",
            "The other ranks keep their own gradients, so their parameters drift apart.",
            "Use dist.all_reduce, which leaves the sum on every rank.", reduces_to_rank_zero,
            requires=others_hold_no_sum),
    Mistake("grads_unchanged", "Your function leaves every rank's .grad as it was.",
            "Averaging a copy (or nothing) leaves the gradients the optimizer reads untouched.",
            "All-reduce each p.grad in place (or copy the result back into it) and divide by the world size.",
            grads_unchanged, variants=("does_nothing", "averages_a_copy"), includes=EVERY),
    Mistake("averages_parameters", "You all-reduce the parameters instead of their gradients.",
            "DDP averages gradients; the parameters stay for the optimizer to update.",
            "All-reduce p.grad, not p (or p.data).", averages_parameters, includes=EVERY),
    Mistake("also_steps_the_parameters", "You also update the parameters inside the function.",
            "The optimizer steps after the call; updating here moves the parameters twice.",
            "Only average the gradients; leave the parameters to optimizer.step().", also_steps_the_parameters),
    Mistake("crashes_on_missing_grad", "You all-reduce every parameter's .grad, also those that are None.",
            "Frozen or unused parameters have no gradient (.grad is None).",
            "Skip parameters whose .grad is None (`if p.grad is None: continue`).", crashes_on_missing_grad,
            variants=("skips_by_requires_grad_only",)),
    Mistake("zero_fills_missing_grads", "You give a zero gradient to parameters that had none.",
            "With momentum or weight decay a zero gradient still moves them; DDP leaves .grad as None.",
            "Skip parameters whose .grad is None.", zero_fills_missing_grads),
    Mistake("stops_at_first_missing_grad", "You stop at the first parameter without a gradient (break or return).",
            "The parameters after it are never averaged.", "Skip only that parameter: continue, not break.",
            stops_at_first_missing_grad),
    Mistake("deadlocks_rank_one", "Your ranks do not all call the same collectives (one rank skips or adds one).",
            "A collective completes only when every rank calls it: the others wait forever.",
            "Make every rank call the same collectives, in the same order, on tensors of the same shape.",
            deadlocks_rank_one),
]


# What the observed values are called in the exercise, and the factors a plausible mistake scales them by. The
# gradients are listed in the order of the grader's Net's parameters (observe.Net; the unused layer only in one scenario).
PARAMETERS = tuple(f"parameter {name}" for name in ("hidden.weight", "hidden.bias", "out.weight", "out.bias",
                                                  "unused.weight", "unused.bias"))
LOCATE = Locate(names={"grads_after": "the gradients after your call", "params_after": "the parameters after your call",
                       "final": "the parameters after training", "grads_before": "the gradients before your call"},
                ignore=("forbidden", "collectives"), unchanged={"grads_after": "grads_before"},
                positions={"grads_after": PARAMETERS, "grads_before": PARAMETERS},
                factors=lambda case: {"world_size": case["world_size"]}, counts=("world_size",))
