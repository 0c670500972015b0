"""The known mistakes of ``BucketedDDP`` and their fingerprints in the ranks' records (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/bucketed_ddp.py (tests/exercises/test_diagnosis.py).
Each rank records, per step, its gradients after synchronisation and the events of its backward pass (a gradient
ready, an all-reduce issued, a wait, backward done); the reference carries DDP's run (``ddp``). The gradients are read
with the checks' own ``gradient_problem``, which already tells a sum from an average and a rank from another.
"""
import re

from ..judging.checking import ABORTED, DEADLOCK, close
from ..judging.diagnosis import EVERY, Mistake, error_of, ran
from ..judging.localise import Locate
from .checks import calls_per_step, gradient_problem


def _ranks(student, key) -> list[dict]:
    ranks = ran(student, key)["ranks"]
    if not isinstance(ranks, list) or not ranks:
        raise KeyError(key)
    return ranks


def _events(student, key="per_param", step=0) -> list[str]:
    return [e[0] for e in _ranks(student, key)[0]["steps"][step]["events"]]


def _issued_after_backward(kinds: list[str]) -> bool:
    issued = [i for i, k in enumerate(kinds) if k == "issue"]
    done = kinds.index("backward done") if "backward done" in kinds else len(kinds)
    return bool(issued) and issued[0] > done


def _grads_right(student, reference, *keys) -> bool:
    return all(gradient_problem(student, reference, key) is None for key in keys)


def _problem(student, reference, key) -> str:
    return gradient_problem(student, reference, key) or ""


def wraps_torch_ddp(student, reference):
    if any(r.get("forbidden") for r in _ranks(student, "one_bucket")):
        return "your BucketedDDP built torch's DistributedDataParallel"
    return None


def all_reduce_only_after_backward(student, reference):
    if _grads_right(student, reference, "per_param") and _issued_after_backward(_events(student, step=0)):
        return "the gradients are right, but every all-reduce started after backward() had finished"
    return None


def never_resets_between_steps(student, reference):
    if _grads_right(student, reference, "per_param") and not _issued_after_backward(_events(student, step=0)) \
            and _issued_after_backward(_events(student, step=1)):
        return ("in step 1 the all-reduces started from the gradient hooks, but in step 2 every one started after "
                "backward() had finished: the buckets' counts of ready gradients carried over from step 1")
    return None


def waits_in_the_hook(student, reference):
    kinds = _events(student)
    waits_before_done = kinds[:kinds.index("backward done")].count("wait") if "backward done" in kinds else 0
    if _grads_right(student, reference, "per_param") and waits_before_done and waits_before_done >= kinds.count("issue") - 1:
        return "each all-reduce was waited for right after it started, while backward still had gradients to compute"
    return None


def no_all_reduce(student, reference):
    sizes = calls_per_step(_ranks(student, "one_bucket"))
    return not any(s for rank in sizes for s in rank)


def does_nothing(student, reference):
    if no_all_reduce(student, reference) and "holds a gradient other ranks do not" in _problem(student, reference, "one_bucket"):
        return "no all-reduce ran, and every rank kept its own gradients"
    return None


def zeroes_the_gradients(student, reference):
    if no_all_reduce(student, reference) and ("0× the average" in _problem(student, reference, "one_bucket")
                                              or "zero gradients" in _problem(student, reference, "one_bucket")):
        return "no all-reduce ran, and every gradient is 0 after synchronisation"
    return None


def sums_without_dividing(student, reference):
    n = reference["scenarios"]["one_bucket"]["case"]["world_size"]
    if f"{n}× the average gradient" in _problem(student, reference, "one_bucket"):
        return f"on {n} ranks every gradient is {n} × the average"
    return None


def every_bucket_summed(student, reference) -> bool:
    """With one bucket per parameter, and with small buckets, every gradient is N × the average too: a division by
    anything else that is N only when there is one bucket (the number of buckets) is not this mistake."""
    n = reference["scenarios"]["per_param"]["case"]["world_size"]
    return all(f"{n}× the average gradient" in _problem(student, reference, key) for key in ("per_param", "mid"))


def does_not_broadcast(student, reference):
    ranks = _ranks(student, "three_ranks")
    if _grads_right(student, reference, "one_bucket") and ranks[0]["after_init"] != ranks[1]["after_init"]:
        return "on 3 ranks that start from different weights, the weights still differ after BucketedDDP(...)"
    return None


def one_all_reduce_per_parameter(student, reference):
    sizes = calls_per_step(_ranks(student, "one_bucket"))[0][0]
    n_params = len(reference["scenarios"]["per_param"]["ranks"][0]["names"])
    if _grads_right(student, reference, "one_bucket") and len(sizes) == n_params > 1:
        return f"with a bucket larger than the model, step 1 issued {len(sizes)} all-reduces, one per parameter"
    return None


def launches_bucket_at_its_first_gradient(student, reference):
    if "the wrong gradient for" in _problem(student, reference, "one_bucket") and not no_all_reduce(student, reference):
        return ("ranks agree, but some gradients are not DDP's: the bucket was all-reduced before all of its "
                "gradients were in it")
    return None


def first_gradient_averaged(student, reference) -> bool:
    """The gradient that launched the bucket is in it: at least one parameter's first-step gradient is DDP's."""
    got = _ranks(student, "one_bucket")[0]["steps"][0]["grads"]
    want = reference["scenarios"]["one_bucket"]["ranks"][0]["steps"][0]["grads"]
    return any(close(g, w, atol=1e-6, rtol=1e-4) for g, w in zip(got, want))


def hooks_on_frozen_parameters(student, reference):
    if "doesn't require gradient" in error_of(student, "special"):
        return "registering a hook on the frozen parameter raised an error"
    return None


def never_sends_bucket_with_unused_parameter(student, reference):
    if _grads_right(student, reference, "one_bucket", "mid") and \
            "holds a gradient other ranks do not" in _problem(student, reference, "special"):
        return "with an unused layer, the bucket holding it was never all-reduced: ranks keep different gradients"
    return None


def waits_forever_for_unused_parameter(student, reference):
    if error_of(student, "special") == DEADLOCK and _grads_right(student, reference, "one_bucket"):
        return "with an unused layer, the ranks waited for a gradient that never comes"
    return None


def rank_dependent_bucket_order(student, reference):
    # buckets of different sizes meet in one all-reduce: gloo aborts the rank that checks the size (SIGABRT), or,
    # when another rank reads the broken stream first, that rank dies of another signal
    special = error_of(student, "special")
    died = special == ABORTED or bool(re.fullmatch(r"rank \d+ died without a result \(signal SIG[A-Z]+\)", special))
    if died and "holds a gradient other ranks do not" in _problem(student, reference, "mid"):
        return "ranks exchanged buckets of different sizes: they built their buckets in different orders"
    return None


MISTAKES = [
    Mistake("wraps_torch_ddp", "Your BucketedDDP builds torch's DistributedDataParallel.",
            "This exercise asks you to write the buckets, hooks and all-reduces yourself.",
            "Group the parameters into buckets and all-reduce each from a gradient hook.", wraps_torch_ddp,
            includes=EVERY),
    Mistake("all_reduce_only_after_backward", "You all-reduce the buckets only after backward() has finished.",
            "Then no communication overlaps with the gradient computation: DDP's whole point.",
            "Launch each bucket's all-reduce (async_op=True) from a gradient hook as soon as its last gradient is "
            "ready.", all_reduce_only_after_backward),
    Mistake("never_resets_between_steps", "You never reset the buckets' counts of ready gradients after a step.",
            "In the next step the counts start full, so no hook sees its bucket become ready, and every bucket waits "
            "for the end of backward.", "Reset each bucket's count (and handles) in finish_gradient_synchronization.",
            never_resets_between_steps),
    Mistake("waits_in_the_hook", "You wait for each all-reduce right after starting it (or all-reduce synchronously).",
            "Waiting inside the hook blocks backward: the communication no longer overlaps with computation.",
            "Start with async_op=True and wait for the handles only in finish_gradient_synchronization.",
            waits_in_the_hook, variants=("synchronous_all_reduce_per_bucket", "waits_at_once_in_the_hook")),
    Mistake("does_nothing", "Your BucketedDDP never all-reduces anything.",
            "Each rank then steps with its own gradient, and the replicas drift apart.",
            "All-reduce every bucket from the gradient hooks and copy the averages back into .grad.", does_nothing,
            includes=EVERY),
    Mistake("zeroes_the_gradients", "Your synchronisation leaves zero gradients.",
            "The buckets' averages never reach .grad (or .grad is overwritten with zeros).",
            "Copy each bucket's averaged slice back into its parameter's .grad.", zeroes_the_gradients,
            includes=EVERY),
    Mistake("sums_without_dividing", "You all-reduce the buckets but never divide by the world size.",
            "all_reduce sums; DDP averages.", "Divide each bucket by the world size once.", sums_without_dividing,
            requires=every_bucket_summed),
    Mistake("does_not_broadcast", "You do not broadcast rank 0's parameters in __init__.",
            "Ranks that start from different weights then train different models.",
            "dist.broadcast every parameter (and buffer) from rank 0 in __init__.", does_not_broadcast),
    Mistake("one_all_reduce_per_parameter", "You all-reduce each parameter separately, whatever the bucket size.",
            "Buckets exist to send few large messages instead of many small ones.",
            "Flatten each bucket's gradients into one tensor and all-reduce that.", one_all_reduce_per_parameter),
    Mistake("launches_bucket_at_its_first_gradient", "You launch a bucket's all-reduce when its first gradient is "
            "ready.", "Its other gradients are not in the buffer yet: they are sent as stale values or zeros.",
            "Launch the bucket only when all of its gradients are ready (count them).",
            launches_bucket_at_its_first_gradient, requires=first_gradient_averaged),
    Mistake("hooks_on_frozen_parameters", "You register hooks on parameters that do not require gradients.",
            "A frozen parameter has no gradient and accepts no hook.",
            "Bucket and hook only parameters with requires_grad.", hooks_on_frozen_parameters),
    Mistake("never_sends_bucket_with_unused_parameter", "A bucket holding a parameter without gradient is never "
            "all-reduced.", "An unused layer's hook never fires, so its bucket never counts as ready.",
            "In finish_gradient_synchronization, all-reduce every bucket that has not been launched.",
            never_sends_bucket_with_unused_parameter),
    Mistake("waits_forever_for_unused_parameter", "You wait for every parameter's gradient, also unused ones.",
            "An unused layer gets no gradient in this step: waiting for it blocks forever.",
            "Launch the buckets still pending at finish_gradient_synchronization instead of waiting for their hooks.",
            waits_forever_for_unused_parameter),
    Mistake("rank_dependent_bucket_order", "Your ranks build their buckets in different orders.",
            "All-reduces pair up by order: ranks then sum different buckets (or sizes) together.",
            "Build the buckets from the parameters in the same deterministic order on every rank.",
            rank_dependent_bucket_order),
]


# What the observed values are called in the exercise, and the factors a plausible mistake scales them by.
LOCATE = Locate(names={"grads": "the gradients after backward", "final": "the parameters after training",
                       "after_init": "the parameters after construction"},
                positions={"grads": "parameter {n}"}, ignore=("events", "forbidden", "gated", "names"),
                factors=lambda case: {"world_size": case["world_size"]}, across=("grads",))
