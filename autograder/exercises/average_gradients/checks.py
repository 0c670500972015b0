"""The checks of ``average_gradients``: plain Python on the observations (no torch here)."""
from ..judging.checking import case, close, flat, rank_results, scale_factor
from .cases import GRAD_ATOL, PARAM_ATOL


def ranks_of(student: dict, reference: dict, key: str) -> list[dict]:
    """The scenario's per-rank records, or a ScenarioError with one sentence for the student."""
    return rank_results(student, reference, key, reword=lambda message: f"{message} Parameters whose .grad is None "
                        "must be skipped." if "NoneType" in message else message)


def mean_over_ranks(vectors: list[list[float]]) -> list[float]:
    return [sum(vals) / len(vals) for vals in zip(*vectors)]


def averaging_problem(ranks: list[dict], n: int, label: str) -> str | None:
    """Whether every call left every rank with the mean over ranks of the gradients it was given."""
    for c in range(len(ranks[0]["calls"])):
        before = [flat(r["calls"][c]["grads_before"]) for r in ranks]
        after = [flat(r["calls"][c]["grads_after"]) for r in ranks]
        want = mean_over_ranks(before)
        if n > 1 and not close(before[0], want, atol=GRAD_ATOL, rtol=1e-5) and all(
                close(got, before[0], atol=GRAD_ATOL, rtol=1e-5) for got in after):
            return (f"{label}, call {c + 1}: every rank holds rank 0's gradient, not the average over ranks: "
                    "use all_reduce, not broadcast.")
        for rank, got in enumerate(after):
            if close(got, want, atol=GRAD_ATOL, rtol=1e-5):
                continue
            where = f"{label}, call {c + 1}, rank {rank}"
            if len(got) != len(want):
                return f"{where}: some parameters lost their gradient: keep every .grad, averaged in place."
            if close(got, before[rank], atol=GRAD_ATOL, rtol=1e-5):
                return (f"{where}: the gradient is still this rank's own: all-reduce each parameter's .grad "
                        "(not the parameter) and divide by the world size.")
            if rank > 0 and close(after[0], want, atol=GRAD_ATOL, rtol=1e-5):
                return (f"{where}: only rank 0 holds the average, as after dist.reduce: use dist.all_reduce, which "
                        "leaves the result on every rank.")
            factor = scale_factor(got, want)
            if factor is not None and close(got, [factor * w for w in want], atol=GRAD_ATOL, rtol=1e-4):
                if abs(factor - n) < 1e-3:
                    return (f"{where}: the gradient is {n}× the average: all_reduce sums, so divide by the world "
                            "size afterwards.")
                return (f"{where}: the gradient is {factor:.3g}× the average: divide the summed gradient by the "
                        f"world size ({n}) exactly once.")
            return f"{where}: the gradient is not the average of the ranks' gradients."
    return None


def ranks_really_averaged(got: dict, want: dict) -> str | None:
    """The evidence, in two parts. Each rank's first local gradient, computed by the grader's loop before the
    student's function ran, equals the reference's: only the real run on the seeded problem gives it. And after
    the first call some rank holds a gradient that is not a multiple of its own: gradients were combined across
    ranks. A function that does nothing (or only scales) passes no check, however vacuously true."""
    mine, theirs = got["ranks"], want["ranks"]
    if len(mine) != len(theirs) or not all(
            close(flat(g["calls"][0]["grads_before"]), flat(w["calls"][0]["grads_before"]), atol=GRAD_ATOL)
            for g, w in zip(mine, theirs)):
        return "the ranks' own gradients differ from the grader's seeded problem."
    for r in mine:
        before, after = flat(r["calls"][0]["grads_before"]), flat(r["calls"][0]["grads_after"])
        if len(after) != len(before):
            return None  # it changed which parameters have a gradient: not nothing (other checks judge it)
        factor = scale_factor(after, before)
        if factor is not None and not close(after, [factor * b for b in before], atol=GRAD_ATOL, rtol=1e-5):
            return None
    return (f"when {want['case']['what']}, every rank still holds its own gradient (or a multiple of it) after your "
            "function: it combined nothing across ranks.")


# ---- the checks ----------------------------------------------------------------------------

def check_same_on_every_rank(student, reference):
    ranks = ranks_of(student, reference, "two_ranks")
    for c, call0 in enumerate(ranks[0]["calls"]):
        for rank, r in enumerate(ranks[1:], start=1):
            if not close(flat(r["calls"][c]["grads_after"]), flat(call0["grads_after"]), atol=GRAD_ATOL, rtol=1e-5):
                unchanged = all(close(flat(x["calls"][c]["grads_after"]), flat(x["calls"][c]["grads_before"]),
                                      atol=GRAD_ATOL) for x in ranks)
                if unchanged:
                    return (f"After call {c + 1} each rank still holds its own gradient: all-reduce every "
                            "parameter's .grad, not the parameters.")
                return (f"After call {c + 1} rank 0 and rank {rank} hold different gradients: use dist.all_reduce, "
                        "which leaves the result on every rank (dist.reduce fills only the destination rank).")
    return None


def check_average_two(student, reference):
    n = case(reference, "two_ranks")["world_size"]
    return averaging_problem(ranks_of(student, reference, "two_ranks"), n, f"With {n} ranks")


def check_world_size(student, reference):
    n = case(reference, "three_ranks")["world_size"]
    ranks = ranks_of(student, reference, "three_ranks")
    problem = averaging_problem(ranks, n, f"With {n} ranks")
    if problem and f"{n / 2:.3g}× the average" in problem:
        return (f"With {n} ranks your gradient is {n / 2:.3g}× the average, as if you divided by 2: ask "
                "dist.get_world_size() instead of hard-coding the number of ranks.")
    if problem:
        return problem
    want = reference["ddp"]["three_ranks"][0]
    if not all(close(r["final"], want, atol=PARAM_ATOL) for r in ranks):
        return f"With {n} ranks the trained parameters differ from DistributedDataParallel's."
    return None


def check_params_untouched(student, reference):
    for rank, r in enumerate(ranks_of(student, reference, "two_ranks")):
        for c, call in enumerate(r["calls"]):
            if not close(call["params_after"], call["params_before"], atol=1e-7):
                return (f"Call {c + 1} changed rank {rank}'s parameters: average the gradients (p.grad) and leave "
                        "the parameters to the optimizer's step.")
    return None


def check_no_grad_params(student, reference):
    ranks = ranks_of(student, reference, "no_grad_params")
    for c in range(case(reference, "no_grad_params")["steps"]):
        calls = [r["calls"][c] for r in ranks]
        averaged = []  # per parameter with a gradient: did the call change it on some rank?
        for i, before in enumerate(calls[0]["grads_before"]):
            if before is None:
                if any(call["grads_after"][i] is not None for call in calls):
                    return ("You gave a gradient to parameters that had none (a frozen bias, an unused layer): leave "
                            ".grad as None, as DDP does; with momentum or weight decay a zero gradient moves them.")
                averaged.append(None)
            else:
                averaged.append(any(call["grads_after"][i] is None or not close(
                    call["grads_after"][i], call["grads_before"][i], atol=0.0) for call in calls))
        first_none = averaged.index(None)
        if any(averaged[:first_none]) and not all(a for a in averaged[first_none:] if a is not None):
            return ("Parameters that come after one without a gradient were not averaged: skip only the "
                    "parameters whose .grad is None (continue, not break or return).")
    return None


def check_matches_ddp(student, reference):
    c = case(reference, "two_ranks")
    finals = [r["final"] for r in ranks_of(student, reference, "two_ranks")]
    ddp, single = reference["ddp"]["two_ranks"][0], reference["single"]["two_ranks"]
    if all(close(f, ddp, atol=PARAM_ATOL) and close(f, single, atol=PARAM_ATOL) for f in finals):
        return None
    if not close(finals[0], finals[1], atol=PARAM_ATOL):
        return (f"After {c['steps']} steps of data-parallel training the {c['world_size']} ranks hold different "
                "parameters: every rank must step with the same (averaged) gradient.")
    return (f"After {c['steps']} steps on {c['world_size']} ranks the parameters match neither "
            "DistributedDataParallel nor one process on the full batch.")
