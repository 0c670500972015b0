"""The known mistakes of ``ShardedOptimizer`` and their fingerprints in the ranks' records (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/sharded_optimizer.py
(tests/exercises/test_diagnosis.py). Each rank records its parameters after every step and the optimizer state it holds; the
reference's scenarios carry the unsharded optimizer's run (``truth``). The ``memory`` scenario's readings (what each
rank holds after each step, read outside the rank) carry the reference's and the unsharded optimizer's, measured the
same way: what the object shows can be shaped by the student, these cannot.
"""
from ..judging.checking import DEADLOCK
from ..judging.diagnosis import EVERY, Mistake, error_of, ran
from ..judging.localise import Locate
from .checks import held_between_steps, pause_problem, same


def _ranks(student, key) -> list[dict]:
    ranks = ran(student, key)["ranks"]
    if not isinstance(ranks, list) or not ranks:
        raise KeyError(key)
    return ranks


def _truth(reference, key) -> dict:
    return reference["scenarios"][key]["truth"]


def _stale(student, reference, key) -> int:
    """Parameter tensors that the unsharded optimizer moves but rank 0 still holds as they started."""
    initial = reference["scenarios"][key]["ranks"][0]["initial"]
    last, want = _ranks(student, key)[0]["steps"][-1], _truth(reference, key)["steps"][-1]
    return sum(same([got], [first]) and not same([w], [first]) for got, first, w in zip(last, initial, want))


def _agree(student, key) -> bool:
    ranks = _ranks(student, key)
    return all(same(r["steps"][i], ranks[0]["steps"][i]) for r in ranks for i in range(len(ranks[0]["steps"])))


def _right(student, reference, key) -> bool:
    return all(same(r["steps"][i], w) for r in _ranks(student, key) for i, w in enumerate(_truth(reference, key)["steps"]))


def _state_share(student, reference, key) -> float:
    return sum(float(r["state_bytes"]) for r in _ranks(student, key)) / _truth(reference, key)["state_bytes"]


def torch_zero(student, reference):
    if any(r.get("forbidden") for r in _ranks(student, "adamw_two")):
        return "a rank used torch.distributed.optim.ZeroRedundancyOptimizer"
    return None


def does_nothing(student, reference):
    n = len(reference["scenarios"]["adamw_two"]["ranks"][0]["initial"])
    if _state_share(student, reference, "adamw_two") == 0 and _stale(student, reference, "adamw_two") == n:
        return "no rank holds optimizer state, and no parameter moved"
    return None


def broadcasts_from_the_wrong_owner(student, reference):
    stale = _stale(student, reference, "sgd_three")
    if stale and _agree(student, "sgd_three") and _state_share(student, reference, "sgd_three") >= 0.9:
        return (f"on 3 ranks every rank holds the same parameters, but {stale} tensors came back as they started, "
                "though their owners hold their optimizer state")
    return None


def never_shares_the_parameters(student, reference):
    if not _agree(student, "adamw_two"):
        return "after the first step the ranks hold different parameters"
    return None


def every_rank_holds_a_stale_share(student, reference) -> bool:
    """Never sharing leaves every rank with the parameters the others own as they were after the first step: each
    rank holds some wrong parameter (one rank right, or one parameter stale on one rank only, is another bug)."""
    want = _truth(reference, "adamw_two")["steps"][0]
    return all(any(not same([got], [w]) for got, w in zip(r["steps"][0], want)) for r in _ranks(student, "adamw_two"))


def every_rank_steps_everything(student, reference):
    share = _state_share(student, reference, "adamw_two")
    if _right(student, reference, "adamw_two") and share > 1.5:
        return f"on 2 ranks the ranks together hold {share:.2g} × the unsharded optimizer state"
    return None


def _unsharded_share_held(student, reference) -> float:
    """How far, between the reference's ranks (0) and the unsharded optimizer's (1), the student's rank that held the
    most between steps lies (the memory scenario, read outside the ranks)."""
    want = reference["scenarios"]["memory"]
    c = want["case"]
    got = held_between_steps(ran(student, "memory")["meter"], c)
    sharded, unsharded = max(held_between_steps(want["meter"], c)), min(held_between_steps(want["truth"]["meter"], c))
    return (max(got) - sharded) / (unsharded - sharded)


def answers_gates_in_advance(student, reference):
    meter = ran(student, "memory")["meter"]
    for rank in range(reference["scenarios"]["memory"]["case"]["world_size"]):
        problem = pause_problem(meter, rank, reference)
        # the first pause comes before any seed: one reached with wrong parameters there is a wrong first step
        if problem and (("asked early" in problem and "pause 1 of" not in problem) or "times where" in problem):
            return f"rank {rank} {problem}"
    return None


def no_sharding_balanced_looking_state(student, reference):
    share, held = _state_share(student, reference, "adamw_two"), _unsharded_share_held(student, reference)
    n = reference["scenarios"]["memory"]["case"]["world_size"]
    if _right(student, reference, "adamw_two") and 0.9 <= share <= 1.1 and held >= 0.5:
        return (f"the state your object shows adds up to {share:.0%} of the unsharded optimizer's, split between the "
                f"ranks, yet between steps on {n} ranks a rank held {held:.0%} of the extra memory the unsharded "
                "optimizer keeps (measured outside your ranks): every rank stepped and kept the state of every "
                "parameter")
    return None


def round_robin_unbalanced(student, reference):
    ranks, truth = _ranks(student, "adamw_two"), _truth(reference, "adamw_two")
    n, total = len(ranks), truth["state_bytes"]
    limit = total / n + (1 - 1 / n) * max(truth["per_param_bytes"]) + 64 * n
    if _right(student, reference, "adamw_two") and 0.9 <= _state_share(student, reference, "adamw_two") <= 1.1 and any(
            float(r["state_bytes"]) > limit for r in ranks):
        worst = max(float(r["state_bytes"]) for r in ranks) / total
        return f"on 2 ranks one rank holds {worst:.0%} of the optimizer state"
    return None


def drops_group_hyperparameters(student, reference):
    if _right(student, reference, "adamw_two") and _agree(student, "groups") and not _stale(student, reference, "groups") \
            and not _right(student, reference, "groups"):
        return "with two parameter groups of their own lr and weight_decay, the parameters differ from one process's"
    return None


def no_add_param_group(student, reference):
    stale = _stale(student, reference, "groups")
    if _right(student, reference, "adamw_two") and stale:
        return f"after add_param_group, {stale} parameter tensors of the new group were never updated"
    return None


def empty_shard_crashes(student, reference):
    if "empty parameter list" in error_of(student, "few_params"):
        return "with fewer parameter tensors than ranks, a rank's optimizer got an empty parameter list"
    return None


def deadlocks(student, reference):
    if error_of(student, "adamw_two") == DEADLOCK:
        return "on 2 ranks a rank waited in a collective the other never called"
    return None


MISTAKES = [
    Mistake("torch_zero_redundancy_optimizer", "You use torch's ZeroRedundancyOptimizer.",
            "This exercise asks you to write the sharding yourself; the lesson compares torch's with yours.",
            "Give each rank an optimizer_cls over its share of the parameters, and broadcast each updated share.",
            torch_zero, includes=EVERY),
    Mistake("does_nothing", "Your step() updates nothing and no rank keeps an optimizer.",
            "Every parameter needs one owner that steps it with its own optimizer state.",
            "Build each rank's optimizer over its share in __init__, step it in step(), then share the results.",
            does_nothing, includes=EVERY),
    Mistake("broadcasts_from_the_wrong_owner", "You broadcast each parameter from a rank that does not own it.",
            "The owner stepped it; a broadcast from any other rank sends the old value back to everyone.",
            "Broadcast each parameter with src = the rank that owns it (the same ownership every rank computes).",
            broadcasts_from_the_wrong_owner),
    Mistake("never_shares_the_parameters", "You never send the updated parameters to the other ranks.",
            "Each rank steps only its share, so the others keep stale copies and the replicas drift apart.",
            "After the local step, broadcast each parameter from its owner (or all-gather the shares).",
            never_shares_the_parameters, requires=every_rank_holds_a_stale_share),
    Mistake("every_rank_steps_everything", "Every rank keeps an optimizer over all the parameters.",
            "That is plain data parallelism: the optimizer state is replicated, not sharded (ZeRO-1 saves nothing).",
            "Give each rank's optimizer only the parameters that rank owns.", every_rank_steps_everything),
    Mistake("no_sharding_balanced_looking_state", "Every rank steps a full optimizer over all the parameters, kept "
            "where the grader's count of your object's state does not look, and shows only its share.",
            "The memory a rank holds is measured outside it: it holds the whole optimizer state, as plain data "
            "parallelism does, so ZeRO-1 saves nothing.",
            "Keep and step only an optimizer over the parameters this rank owns, then send them to the other ranks.",
            no_sharding_balanced_looking_state),
    Mistake("answers_gates_in_advance", "Your code asks at the grader's pauses itself, ahead of the steps they "
            "follow, or more often than once after each step().",
            "Each pause measures what a rank keeps between steps, and its answer draws the next step's gradients: "
            "asked ahead, it measures a rank that has not stepped.",
            "Never call the grader's gates yourself: let its loop stop after each step().", answers_gates_in_advance),
    Mistake("round_robin_unbalanced", "You deal the parameter tensors out round-robin, ignoring their sizes.",
            "One large tensor then makes one rank hold most of the optimizer state.",
            "Give each tensor, largest first, to the rank with the fewest elements so far.", round_robin_unbalanced),
    Mistake("drops_group_hyperparameters", "You rebuild the parameter groups without their own hyperparameters.",
            "Each group's lr and weight_decay must reach the optimizer that steps its parameters.",
            "Copy every key of each group (not only 'params') into the shard's groups.", drops_group_hyperparameters),
    Mistake("no_add_param_group", "add_param_group does not give the new group's parameters to an owner.",
            "Parameters added after construction then are never stepped.",
            "In add_param_group, assign the new parameters to owners and add them to their optimizers.",
            no_add_param_group),
    Mistake("empty_shard_crashes", "You build a rank's optimizer even when it owns no parameter.",
            "torch's optimizers refuse an empty parameter list.",
            "Create a rank's optimizer only when its share is not empty.", empty_shard_crashes),
    Mistake("only_the_owner_broadcasts", "Only the owner calls broadcast for its parameters.",
            "A broadcast is a collective: every rank must call it (the others receive).",
            "Have every rank call dist.broadcast(p, src=owner) for every parameter, in the same order.", deadlocks),
]


# What the observed values are called in the exercise, and the factors a plausible mistake scales them by.
LOCATE = Locate(names={"initial": "the initial parameters", "steps": "the parameters after each step",
                       "state_bytes": "the optimizer state's bytes on a rank"},
                ignore=("checksums", "groups", "forbidden"),
                factors=lambda case: {"world_size": case["world_size"]}, across=("steps",),
                inner={"steps": "parameter {n}"})
