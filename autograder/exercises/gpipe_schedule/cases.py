"""The scenarios of ``gpipe_schedule``: (num_stages, num_microbatches) pairs (plain Python)."""
from ..scenarios import held_out_rng

# (num_stages, num_microbatches) of the public scenarios: the first is the lesson's example.
MAIN_CASES = [(2, 4), (4, 8), (3, 5), (5, 3), (4, 4), (6, 9), (3, 2)]
EDGE_CASES = [(1, 1), (1, 4), (3, 1), (2, 1)]  # one stage (no pipeline), one micro-batch (no overlap)
STAGES, MICROBATCHES = range(2, 7), range(2, 10)  # where held-out main cases are drawn from
MAX_STEPS = 400  # anything longer cannot be a schedule for these cases


def held_out_cases(salt: int) -> tuple[list, list]:
    """Main and edge cases for a non-zero salt: as many as the public ones, none of the public main cases."""
    rng = held_out_rng(salt, "gpipe_schedule")
    unseen = [(p, m) for p in STAGES for m in MICROBATCHES if (p, m) not in MAIN_CASES]
    main = rng.sample(unseen, len(MAIN_CASES))
    edges = [(1, 1), (1, rng.choice([m for m in MICROBATCHES if m != 4]))] + [
        (p, 1) for p in rng.sample([p for p in STAGES if p not in (2, 3)], 2)]
    return main, edges


def cases(salt: int) -> dict[str, dict]:
    """Scenarios ``main_0``.. and ``edge_0``..: the public (p, m) for salt 0, held-out ones for any other salt."""
    main, edges = (MAIN_CASES, EDGE_CASES) if salt == 0 else held_out_cases(salt)
    return {f"{kind}_{i}": {"what": f"called with {_what(p, m)}", "num_stages": p, "num_microbatches": m}
            for kind, pairs in (("main", main), ("edge", edges)) for i, (p, m) in enumerate(pairs)}


MAIN = tuple(f"main_{i}" for i in range(len(MAIN_CASES)))
EDGES = tuple(f"edge_{i}" for i in range(len(EDGE_CASES)))


def _what(p, m):
    return f"num_stages={p}, num_microbatches={m}"
