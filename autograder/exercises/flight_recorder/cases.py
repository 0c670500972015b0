"""The scenarios of ``FlightRecorder``: which collectives the ranks call, and what the grader makes go wrong (plain
Python). Every scenario runs on 4 ranks; the grader's own code calls each collective, and the ranks that would wait
in the one that cannot complete call ``report`` instead (their peers' records say who is missing). In every scenario
one of those ranks is late: let go LATE_S after the others (all together) began their reports, so that what a
report sees at once, and what it sees by waiting, is the same on every run. The late rank's own report gets the
rest of their deadline (``deadline_of``): every report of a scenario ends at the same moment.
"""
from ..scenarios import held_out_rng

WORLD_SIZE = 4
KINDS = ("all_reduce", "broadcast", "all_gather", "barrier")
DEADLINE_S = 0.6   # what report() is given: held ranks stay held well beyond it
LATE_S = 0.15     # how long after the on-time ranks start report() the late rank is let go: well inside the deadline
NAMES = ("dp", "tp")  # the two groups' names in the two-group scenario (the world group, and a group of 3 ranks)

SCENARIOS = {
    "stalled": "two ranks are stalled before a collective and one arrives late",
    "desync": "one rank skips a collective (desynchronised)",
    "two_groups": "a rank is held before the first collective of one of two process groups",
}


def _kinds(rng, n: int) -> list[str]:
    """n kinds, each unlike the one before (so that a skipped collective shows as another kind)."""
    out = [rng.choice(KINDS)]
    while len(out) < n:
        out.append(rng.choice([k for k in KINDS if k != out[-1]]))
    return out


def _rng(salt: int, name: str):
    return held_out_rng(salt, f"flight recorder {name}")


def stalled(salt: int) -> dict:
    """4 collectives on the world group; before collective ``hang`` two of ranks 1-3 are held (longer than the
    deadline), the third arrives LATE_S after rank 0 started its report."""
    if salt == 0:
        kinds, hang, held, late = ["all_reduce", "broadcast", "all_reduce", "barrier"], 3, [1, 3], 2
    else:
        rng = _rng(salt, "stalled")
        kinds, hang = _kinds(rng, 4), rng.randint(2, 4)
        late = rng.randint(1, 3)
        held = [r for r in (1, 2, 3) if r != late]
    return {"steps": [["dp", k] for k in kinds], "hang": hang, "held": held, "late": late, "skips": None}


def desync(salt: int) -> dict:
    """4 collectives; one rank (not 0) skips collective ``hang`` and calls the next: at the same sequence number
    its peers are in another kind of collective. Another rank is late."""
    rng = _rng(salt, "desync")
    kinds = ["all_reduce", "all_gather", "barrier", "all_reduce"] if salt == 0 else _kinds(rng, 4)
    hang, skipper = (2, 2) if salt == 0 else (rng.randint(1, 3), rng.randint(1, 3))
    late = 1 if salt == 0 else rng.choice([r for r in (1, 2, 3) if r != skipper])
    return {"steps": [["dp", k] for k in kinds], "hang": hang, "held": [], "late": late, "skips": skipper}


def two_groups(salt: int) -> dict:
    """The world group ``dp`` and ``tp``, 3 of the 4 ranks: ``tp``'s collectives come first; one ``tp`` rank is held
    before ``dp``'s first collective, so it has checked in on ``tp`` only (its ``dp`` entry is None)."""
    rng = _rng(salt, "two_groups")
    if salt == 0:
        members, held, late, tp, dp = [1, 2, 3], 2, 3, ["all_gather", "all_reduce", "barrier"], "all_reduce"
    else:
        outside = rng.randint(0, 3)
        members = [r for r in range(WORLD_SIZE) if r != outside]
        held = rng.choice([r for r in members if r != 0])
        late = rng.choice([r for r in (1, 2, 3) if r != held])
        tp, dp = _kinds(rng, 3), rng.choice(KINDS)
    steps = [["tp", kind] for kind in tp] + [["dp", dp]]
    return {"steps": steps, "hang": 1, "held": [held], "late": late, "skips": None, "tp_members": members}


def deadline_of(case: dict, rank: int) -> float:
    """What ``report`` is given on ``rank``: DEADLINE_S, and the late rank what the others have left when it is let
    go, so that its wait for the held ranks ends with theirs instead of LATE_S after them (the scenario's wall time)."""
    return round(case["deadline_s"] - LATE_S, 3) if rank == case["late"] else case["deadline_s"]


def collectives_of(steps: list, group: str) -> list[str]:
    return [kind for g, kind in steps if g == group]


def expected(case: dict) -> dict:
    """What the grader made happen, as every reporting rank must report it: ``{rank: {"missing", "last"}}``, for the
    ``dp`` group (sequence numbers count ``dp``'s collectives only, from 1)."""
    kinds = collectives_of(case["steps"], "dp")
    hang = case["hang"]
    last, reporters = [], []
    for rank in range(case["world_size"]):
        if rank in case["held"]:
            seq = hang - 1
            last.append([seq, kinds[seq - 1]] if seq else None)
        elif rank == case["skips"]:
            last.append([hang, kinds[hang]])  # it skipped collective `hang` and entered the next one
            reporters.append(rank)
        else:
            last.append([hang, kinds[hang - 1]])
            reporters.append(rank)
    missing = sorted(case["held"])
    return {rank: {"missing": missing, "last": last} for rank in reporters}


def cases(salt: int) -> dict[str, dict]:
    made = {"stalled": stalled(salt), "desync": desync(salt), "two_groups": two_groups(salt)}
    return {name: {"what": f"{words} (on {WORLD_SIZE} ranks)", "world_size": WORLD_SIZE, "deadline_s": DEADLINE_S,
                   "tp_members": None, **made[name]}
            for name, words in SCENARIOS.items()}
