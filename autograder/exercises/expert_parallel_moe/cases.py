"""The scenarios of ``ExpertParallelMoE`` and the sizes of its layers (plain Python)."""
from ..scenarios import held_out_rng, salted_seed

ATOL, RTOL = 1e-5, 1e-4  # float32 round-off: an expert's rows in another order, sums of partial gradients


SCENARIOS = {  # name: (world size, experts, router biased towards the first experts, what it is)
    "two_ranks": (2, 4, False, "called on 2 ranks (4 experts, 2 per rank, uneven token counts)"),
    "three_ranks_skewed": (3, 6, True, "called on 3 ranks (6 experts) with a router that sends most tokens to the "
                                       "first experts and none to the last rank's"),
    "four_ranks": (4, 4, False, "called on 4 ranks (4 experts, 1 per rank)"),
    "traffic": (4, 4, False, "called on 4 ranks with 96 to 160 tokens of d = 128 each and experts of hidden width "
                           "1024 (bytes measured)"),
}
PUBLIC_SIZES = {  # tokens per rank, d, expert hidden width
    "two_ranks": ([5, 9], 8, 12),
    "three_ranks_skewed": ([7, 3, 10], 8, 10),
    "four_ranks": ([4, 6, 3, 5], 6, 8),
    "traffic": ([128, 96, 160, 128], 128, 1024),
}
# The traffic scenario, sized so that both ways round the method cost far more than it: the tokens (48 to 80 KiB
# a rank) are what all-to-alls move; gathering every token moves about N times as much; moving the experts instead
# (each 1 MiB, hidden 1024) moves about 45 times as much, so no padding of a cheaper exchange can pass for it.
# The same sizes for every salt (its bytes are compared with the reference's).
TRAFFIC_RATIO = 2.0       # the scenario's bytes within this factor of the reference's (correct styles 1.0–1.5)
ROW_SUM_ATOL = 1e-3       # the traffic scenario's evidence, per-row sums over d = 128: round-off ~1e-5, a wrong row ~1
SKEW = (2.5, 1.5)  # added to the router's bias of experts 0 and 1
IDLE = -20.0       # added to the bias of the last rank's experts: that rank receives no token at all


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs; held-out salts draw other token counts (uneven, 2 to 12 per rank), widths and
    seeds. d is larger than the number of experts, so a message of d values or more carries tokens, not counts."""
    found = {}
    for i, (name, (world_size, experts, skewed, words)) in enumerate(SCENARIOS.items()):
        if salt == 0 or name == "traffic":
            tokens, d, hidden = PUBLIC_SIZES[name]
        else:
            rng = held_out_rng(salt, f"sizes of {name}")
            tokens = [rng.randint(2, 12) for _ in range(world_size)]
            while len(set(tokens)) == 1:
                tokens = [rng.randint(2, 12) for _ in range(world_size)]
            d, hidden = rng.choice([8, 10, 12]), rng.randint(6, 14)
        found[name] = {"what": words, "world_size": world_size, "experts": experts, "skewed": skewed,
                       "tokens": list(tokens), "d": d, "hidden": hidden, "seed": salted_seed(700 + i, salt),
                       "measure_traffic": name == "traffic"}
    return found
