"""The checks of ``ShardedOptimizer``: plain Python on the observations (no torch here)."""
from ..reading import case, close, rank_results
from .cases import PARAM_ATOL

ZERO_NOT_ALLOWED = ("Your class uses torch.distributed.optim.ZeroRedundancyOptimizer: this exercise asks you to "
                    "write the sharding yourself (the lesson compares torch's version with yours).")


def ranks_of(student, reference, key: str) -> list[dict]:
    """The student's per-rank results for a scenario, one per rank; torch's ZeRO earns nothing."""
    return rank_results(student, reference, key, forbidden=ZERO_NOT_ALLOWED)


def unsharded(reference, key: str) -> dict:
    return reference["scenarios"][key]["truth"]


def same(a: list, b: list) -> bool:
    """Two parameter lists (per tensor) equal up to round-off."""
    return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(
        close(x, y, atol=PARAM_ATOL) for x, y in zip(a, b))


def did_real_work(got: dict, want: dict) -> str | None:
    """The evidence: after the first step some rank holds some parameter tensor exactly as the unsharded optimizer
    left it, and that tensor moved: only a real step on the seeded problem gives it. A do-nothing optimizer, or an
    invented observation, has none."""
    want_initial, want_first = want["ranks"][0]["initial"], want["truth"]["steps"][0]
    for r in got["ranks"]:
        for i, tensor in enumerate(r["steps"][0]):
            if close(tensor, want_first[i], atol=PARAM_ATOL) and not close(tensor, want_initial[i], atol=PARAM_ATOL):
                return None
    return (f"when {want['case']['what']}, no rank holds a parameter that the first step() updated as "
            f"{want['case']['optimizer']} does.")


def training_problem(student, reference, key: str) -> str | None:
    """None when every rank holds the unsharded optimizer's parameters after every step, else what is wrong."""
    c = case(reference, key)
    ranks, want = ranks_of(student, reference, key), unsharded(reference, key)
    initial = reference["scenarios"][key]["ranks"][0]["initial"]
    for i, expected in enumerate(want["steps"]):
        got = [r["steps"][i] for r in ranks]
        if all(same(g, expected) for g in got):
            continue
        differ = next((r for r in range(1, len(got)) if not same(got[r], got[0])), None)
        if differ is not None:
            return (f"When {c['what']}, after step {i + 1} rank 0 and rank {differ} hold different parameters: after "
                    "stepping its share, each rank must send its updated parameters to every other rank (broadcast "
                    "from the owner, or all-gather).")
        stale = [t for t, tensor in enumerate(got[0])
                 if same([tensor], [initial[t]]) and not same([expected[t]], [initial[t]])]
        if stale:
            return (f"When {c['what']}, {len(stale)} of the {len(initial)} parameter tensors were never updated: every "
                    "parameter needs exactly one owner that steps it, and its updated value must come from that owner.")
        return (f"When {c['what']}, after step {i + 1} the parameters differ from {c['optimizer']} run on one process: "
                "each parameter must be stepped once, with its group's hyperparameters, by the rank that owns it.")
    return None


def check_adamw(student, reference):
    return training_problem(student, reference, "adamw_two")


def check_sgd(student, reference):
    return training_problem(student, reference, "sgd_three")


def check_same_everywhere(student, reference):
    for key in ("adamw_two", "sgd_three"):
        c, ranks = case(reference, key), ranks_of(student, reference, key)
        for i in range(c["steps"]):
            for r in range(1, len(ranks)):
                if not same(ranks[r]["steps"][i], ranks[0]["steps"][i]):
                    return (f"When {c['what']}, after step {i + 1} rank 0 and rank {r} hold different parameters: "
                            "after stepping its share, each rank must send its updated parameters to the others.")
    return None


def check_state_is_sharded(student, reference):
    for key in ("adamw_two", "sgd_three"):
        c, ranks, want = case(reference, key), ranks_of(student, reference, key), unsharded(reference, key)
        n, total, largest = c["world_size"], want["state_bytes"], max(want["per_param_bytes"])
        held = [float(r["state_bytes"]) for r in ranks]
        if sum(held) < 0.9 * total:
            return (f"When {c['what']}, the ranks together hold {sum(held) / total:.0%} of the unsharded "
                    f"{c['optimizer']} state: keep each rank's optimizer (optimizer_cls over its share) in an "
                    "attribute of your object, where it keeps the state of every parameter that rank owns.")
        if sum(held) > 1.1 * total:
            return (f"When {c['what']}, the ranks together hold {sum(held) / total:.2g}× the unsharded "
                    f"{c['optimizer']} state: the state of each parameter must live on one rank only, its owner.")
        limit = total / n + (1 - 1 / n) * largest + 64 * n  # whole tensors: greedy by size stays under this
        for r, h in enumerate(held):
            if h > limit:
                return (f"When {c['what']}, rank {r} holds {h / total:.0%} of the optimizer state, far from 1/{n}: "
                        "balance the shares by size (give each tensor, largest first, to the rank with the fewest "
                        "elements so far).")
    return None


def check_groups(student, reference):
    return training_problem(student, reference, "groups")


def check_few_params(student, reference):
    return training_problem(student, reference, "few_params")
