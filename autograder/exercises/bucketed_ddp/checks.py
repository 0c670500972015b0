"""The checks of ``BucketedDDP``: plain Python on the observations (no torch here)."""
from ..judging.checking import (
    case,
    close,
    evidence_close,
    expected_at_gates,
    flat,
    gate_problem,
    parallel,
    rank_results,
    scale_factor,
    sent_beyond,
    what,
)
from .cases import GRAD_ATOL, GRAD_PRECISION, LAYERS, PARAM_ATOL, SPARE_BUCKETS

FORBIDDEN = ("Your BucketedDDP builds torch's DistributedDataParallel: this exercise asks you to write the buckets, "
             "hooks and all-reduces yourself (see the lesson), so it earns no points.")
NO_FORWARD = ("Your BucketedDDP has no forward method: define forward(self, *inputs, **kwargs) that returns "
              "self.module(*inputs, **kwargs).")


def ranks_of(student: dict, reference: dict, key: str) -> list[dict]:
    """The scenario's per-rank records, or a ScenarioError with one sentence for the student."""
    # "missing the required": nn.Module's own NotImplementedError (no forward), not the blank exercise's
    return rank_results(student, reference, key, forbidden=FORBIDDEN,
                        reword=lambda message: NO_FORWARD if "missing the required" in message else message)


def gradient_problem(student: dict, reference: dict, key: str) -> str | None:
    """Whether every rank's gradients after every step equal DDP's, and its trained parameters too."""
    c = case(reference, key)
    n, when = c["world_size"], what(reference, key)
    ranks, truth = ranks_of(student, reference, key), reference["ddp"][key]
    names = ranks_of(reference, reference, key)[0]["names"]
    for step in range(c["steps"]):
        for rank, mine in enumerate(ranks):
            got, want = mine["steps"][step]["grads"], truth["grads"][step]
            where = f"When {when}, after step {step + 1} rank {rank}"
            for name, g, w in zip(names, got, want):
                if (g is None) != (w is None):
                    return (f"{where} has {'no' if g is None else 'a'} gradient for {name}, where DDP leaves "
                            f"{'one' if g is None else 'None'}: " + (
                                "every trained parameter must get its averaged gradient back." if g is None else
                                "leave .grad None for frozen and unused parameters (fill zeros only in the buffer)."))
            if close(flat(got), flat(want), atol=GRAD_ATOL, rtol=1e-4):
                continue
            factor = scale_factor(flat(got), flat(want))
            if factor is not None and abs(factor) < 1e-6 and close(flat(got), [0.0] * len(got), atol=GRAD_ATOL):
                return f"{where} holds zero gradients: .grad must hold the average over ranks."
            if factor is not None and close(flat(got), [factor * w for w in flat(want)], atol=GRAD_ATOL, rtol=1e-4):
                if abs(factor - n) < 1e-3:
                    return (f"{where} holds {n}× the average gradient: all_reduce sums, so divide by the world size "
                            "(once).")
                return f"{where} holds {factor:.3g}× the average gradient: divide the sum by the world size ({n})."
            wrong = [name for name, g, w in zip(names, got, want)
                     if g is not None and not close(g, w, atol=GRAD_ATOL, rtol=1e-4)]
            if any(not close(flat(other["steps"][step]["grads"]), flat(got), atol=GRAD_ATOL, rtol=1e-4)
                   for other in ranks):
                return (f"{where} holds a gradient other ranks do not (for {', '.join(wrong[:3])}): every bucket "
                        "must be all-reduced and copied back into .grad on every rank.")
            return (f"{where} holds the wrong gradient for {', '.join(wrong[:3])}: each must be copied back from its "
                    "own place in its bucket after that bucket's all-reduce has finished, the same buckets on every "
                    "rank.")
    if len(ranks) != n or not all(close(r["final"], truth["final"], atol=PARAM_ATOL) for r in ranks):
        return f"When {when}, the parameters after {c['steps']} steps differ from DistributedDataParallel's."
    return None


def averaged_for_real(got: dict, want: dict) -> str | None:
    """The evidence: on every rank the first step's gradients point the way the reference's averaged ones do
    (any scale). Only gradients really combined across ranks from the seeded data do that: a rank's own
    gradient, a constant or an invented observation does not."""
    mine, theirs = got["ranks"], want["ranks"]
    if len(mine) == len(theirs) and all(parallel(flat(m["steps"][0]["grads"]), flat(t["steps"][0]["grads"]))
                                        for m, t in zip(mine, theirs)):
        return None
    return (f"when {want['case']['what']}, the gradients after your finish_gradient_synchronization are not the "
            "ranks' gradients combined.")


def calls_per_step(ranks: list[dict]) -> list[list[int]]:
    """Per rank and step: the sizes (elements) of the all-reduces issued during that step."""
    return [[[e[2] for e in s["events"] if e[0] == "issue"] for s in r["steps"]] for r in ranks]


# ---- the checks ----------------------------------------------------------------------------

def check_one_bucket(student, reference):
    return gradient_problem(student, reference, "one_bucket")


def check_per_param(student, reference):
    return gradient_problem(student, reference, "per_param")


def check_mid(student, reference):
    return gradient_problem(student, reference, "mid")


def check_three_ranks(student, reference):
    key = "three_ranks"
    ranks = ranks_of(student, reference, key)
    start = ranks[0]["after_init"]
    if not all(close(r["after_init"], start, atol=0.0) for r in ranks[1:]):
        return (f"When {what(reference, key)}, the ranks still hold different weights after BucketedDDP(...): "
                "broadcast every parameter from rank 0 in __init__, as DDP does.")
    return gradient_problem(student, reference, key)


def check_special(student, reference):
    return gradient_problem(student, reference, "special")


def check_buckets(student, reference):
    total = sum(len(g) for g in ranks_of(reference, reference, "one_bucket")[0]["steps"][0]["grads"])
    n_params = len(ranks_of(reference, reference, "per_param")[0]["names"])
    for key, allowed, rule in (
            ("one_bucket", lambda sizes: sizes == [total],
             "one bucket means one dist.all_reduce of one flat tensor holding every gradient"),
            ("per_param", lambda sizes: len(sizes) == n_params and sum(sizes) == total,
             "a bucket smaller than any parameter means one all-reduce per parameter"),
            ("mid", lambda sizes: 1 < len(sizes) < n_params and sum(sizes) == total,
             "each bucket is all-reduced once as one flat tensor, every gradient in exactly one bucket")):
        for rank_calls in calls_per_step(ranks_of(student, reference, key)):
            for step, sizes in enumerate(rank_calls):
                if not sizes:
                    return (f"When {what(reference, key)}, the grader saw no dist.all_reduce in step {step + 1}: "
                            "call dist.all_reduce(flat_bucket, async_op=True) itself (it counts those calls).")
                if not allowed(sizes):
                    return (f"When {what(reference, key)}, step {step + 1} issued {len(sizes)} all-reduce(s) of "
                            f"{sum(sizes)} values in all: {rule}.")
    return None


def in_process_story(ranks: list[dict]) -> str:
    """What the ranks' own event log says about overlap (their process: words for feedback, never points)."""
    for r in ranks:
        events = r.get("events") or []
        issued = [i for i, e in enumerate(events) if e and e[0] == "issue"]
        backward_done = next((i for i, e in enumerate(events) if e and e[0] == "backward done"), len(events))
        if issued and issued[0] > backward_done:
            return "every all-reduce started after backward() had finished"
    return ""


def rounded_average(got: list, want) -> bool:
    """Every gradient's sum of squares within 1 % of the average's: the right values, rounded (a 16-bit all-reduce),
    rather than other values."""
    return isinstance(want, list) and len(got) == len(want) and all(
        isinstance(g, list) and isinstance(w, list) and len(g) >= 2 and len(w) >= 2
        and abs(float(g[1]) - float(w[1])) <= 0.01 * abs(float(w[1])) for g, w in zip(got, want))


def check_overlap(student, reference):
    """Overlap, measured from outside the ranks (meter.py, OverlapGates): held at a gate, rank 0 went on computing
    while its peers were stopped, and a bucket's all-reduce sent its bytes while rank 0 was stopped before its next
    layer; the ranks' gradients show they really went through the gates; and they sent less than half a bucket more
    than the reference's bytes, every one of which the method needs (cases.SPARE_BUCKETS): bytes sent for show while
    rank 0 is held, a bucket at least, cannot stand in for the all-reduces. The gates' digests and the gradients are
    compared with the launcher's own recomputation under the seeds it answered (meter.GatePolicy.expect)."""
    key = "overlap"
    c, ranks = case(reference, key), ranks_of(student, reference, key)
    meter, theirs = student["scenarios"][key]["meter"], reference["scenarios"][key]["meter"]
    when = f"When {c['what']}"
    for rank, r in enumerate(ranks):
        problem = gate_problem(meter, rank, LAYERS - 1, theirs)
        if problem:
            return (f"{when}, rank {rank} {problem}: call backward() once per step on the wrapped model's loss, and "
                    "let only the grader's model reach its pauses.")
        want = expected_at_gates(meter, "grads")
        if not evidence_close(r["grads"], want, 1e-3, GRAD_PRECISION) and rounded_average(r["grads"], want):
            return (f"{when}, rank {rank}'s gradients after finish_gradient_synchronization are the average over "
                    "ranks to about 3 significant digits only, as a 16-bit all-reduce leaves them: all-reduce the "
                    "float32 gradients.")
        if not evidence_close(r["grads"], want, 1e-3, GRAD_PRECISION):
            return (f"{when}, rank {rank}'s gradients after finish_gradient_synchronization are not the average over "
                    "ranks.")
    gates, story = meter["gates"], in_process_story(ranks)
    if not gates["continued"]:
        return (f"{when}, rank 0 stopped in the middle of backward while the other rank was paused: its all-reduce "
                "waited there for the other rank. Launch each bucket's all-reduce with async_op=True and wait for the "
                "handles only in finish_gradient_synchronization.")
    if (gates["sent_while_held"] or 0) < gates["bucket_bytes"]:
        return (f"{when}, no bucket's all-reduce ran while backward was paused between layers"
                + (f" ({story})" if story else "") + ": launch each bucket's all-reduce from a gradient hook as soon "
                "as its last gradient is ready.")
    extra = sent_beyond(meter, theirs)
    if extra is not None and extra > gates["bucket_bytes"] * SPARE_BUCKETS:
        return (f"{when}, the ranks sent {extra / 1024:.0f} KiB more than one broadcast in __init__ and one all-reduce "
                "per bucket need (bytes measured outside your processes): all-reduce each bucket once, and send "
                "nothing else.")
    return None
