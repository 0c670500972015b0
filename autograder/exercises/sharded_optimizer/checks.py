"""The checks of ``ShardedOptimizer``: plain Python on the observations (no torch here)."""
from ..judging.checking import case, close, expected_at_gates, gate_problem, held_at_gates, rank_results, scenario
from .cases import CHECKSUM_RTOL, PARAM_ATOL

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
    invented observation, has none. In the memory scenario: every rank holds every tensor as the unsharded
    optimizer leaves it after both steps (so no rank saved memory by skipping work)."""
    if want["case"]["model"] == "large":
        return checksums_problem(got, want)
    want_initial, want_first = want["ranks"][0]["initial"], want["truth"]["steps"][0]
    for r in got["ranks"]:
        for i, tensor in enumerate(r["steps"][0]):
            if close(tensor, want_first[i], atol=PARAM_ATOL) and not close(tensor, want_initial[i], atol=PARAM_ATOL):
                return None
    return (f"when {want['case']['what']}, no rank holds a parameter that the first step() updated as "
            f"{want['case']['optimizer']} does.")


def checksums_problem(got: dict, want: dict) -> str | None:
    """The memory scenario's second step ran on gradients drawn from the launcher's seed: its truth is the launcher's
    own recomputation under the seeds it gave these ranks (``observe.expected_steps``)."""
    truth = expected_at_gates(got.get("meter") or {"gates": {}}, "checksums")
    truth = truth[0] if isinstance(truth, list) and truth and isinstance(truth[0], list) else None
    if truth is None:
        return (f"when {want['case']['what']}, the grader could not recompute the parameters after those steps (its "
                "pauses after each step() were not reached as the scenario has them).")
    for r in got["ranks"]:
        sums = r.get("checksums") if isinstance(r, dict) else None
        if not isinstance(sums, list) or len(sums) != len(truth) or not all(
                isinstance(s, list) and close(s, t, atol=CHECKSUM_RTOL * t[1]) for s, t in zip(sums, truth)):
            return (f"when {want['case']['what']}, some rank's parameters are not what {want['case']['optimizer']} "
                    "run on one process leaves after those steps.")
    return None


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
    return memory_problem(student, reference)  # what the object holds, read in the rank, needs the meter's word


MIB = 1 << 20


def held_between_steps(meter, c: dict) -> list[float] | None:
    """What each rank held at the gates after its steps (the launcher's reading from outside the rank, meter.py),
    the most of its gates; None unless every rank has a reading after every step."""
    held = held_at_gates(meter, c["world_size"])
    return [max(h) for h in held] if held and all(len(h) == c["steps"] for h in held) else None


def pause_problem(meter: dict, rank: int, reference) -> str | None:
    """Whether rank ``rank`` reached the grader's pause after each step exactly once, each with the parameters that
    step gives under the launcher's seeds (checking.gate_problem); the words that finish "rank 0 ..." when not."""
    want = reference["scenarios"]["memory"]
    return gate_problem(meter, rank, want["case"]["steps"], want["meter"],
                        words=("the scenario has", "parameters its steps do not give"))


def memory_problem(student, reference) -> str | None:
    """Every rank holds, between steps, less than the reference's ranks plus half of what the unsharded optimizer
    keeps beyond them (both measured the same way, in the same batch)."""
    c = case(reference, "memory")
    ranks_of(student, reference, "memory")
    meter = scenario(student, "memory", c["what"])["meter"]
    for rank in range(c["world_size"]):
        problem = pause_problem(meter, rank, reference)
        if problem:
            return (f"When {c['what']}, rank {rank} {problem}: let only the grader's loop stop at its pauses, once "
                    "after each step() (they measure what a rank keeps between steps).")
    got = held_between_steps(meter, c)
    if got is None:
        return f"When {c['what']}, the grader could not read the memory of every rank after every step()."
    want = reference["scenarios"]["memory"]
    sharded, unsharded = max(held_between_steps(want["meter"], c)), min(held_between_steps(want["truth"]["meter"], c))
    signal = unsharded - sharded
    rank = max(range(len(got)), key=got.__getitem__)
    if got[rank] <= sharded + signal / 2:
        return None
    return (f"When {c['what']}, rank {rank} held {(got[rank] - sharded) / MIB:.0f} MiB more than the reference's "
            f"ranks between steps (measured outside your process), {(got[rank] - sharded) / signal:.0%} of what "
            f"unsharded {c['optimizer']} keeps more: keep {c['optimizer']}'s state for this rank's 1/N of the "
            "parameters only, and no full-size buffers between steps.")


def check_groups(student, reference):
    return training_problem(student, reference, "groups")


def check_few_params(student, reference):
    return training_problem(student, reference, "few_params")
