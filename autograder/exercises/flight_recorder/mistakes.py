"""The known mistakes of ``FlightRecorder`` and their fingerprints in the reports (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/flight_recorder.py
(tests/exercises/test_diagnosis.py). Each reporting rank's record holds its report; what the grader made happen is in the
reference's case (``cases.expected``).
"""
from ..judging.checking import DEADLOCK
from ..judging.diagnosis import EVERY, Mistake, error_of, ran
from ..judging.localise import Locate
from .cases import LATE_S, collectives_of, expected


def _reports(student, key) -> list[tuple[int, dict, dict]]:
    """(rank, report, what it should have said) for every reporting rank whose report has both keys."""
    c = ran(student, key)["case"]
    ranks = ran(student, key)["ranks"]
    out = []
    for rank, want in expected(c).items():
        report = ranks[rank].get("report")
        if isinstance(report, dict) and isinstance(report.get("missing"), list) and isinstance(report.get("last"), list):
            out.append((rank, report, want))
    return out


def only_first_missing(student, reference):
    for rank, report, want in _reports(student, "stalled"):
        if len(want["missing"]) > 1 and report["missing"] == want["missing"][:1]:
            return f"the grader held ranks {want['missing']}; rank {rank} named only rank {report['missing'][0]}"
    return None


def blames_rank_0(student, reference):
    for key in ("stalled", "two_groups"):
        for rank, report, want in _reports(student, key):
            if report["missing"] == [0] and 0 not in want["missing"]:
                return f"the grader held rank(s) {want['missing']}; rank {rank} named rank 0"
    return None


def never_waits(student, reference):
    late = ran(student, "stalled")["case"]["late"]
    for rank, report, _ in _reports(student, "stalled"):
        if late in report["missing"]:
            return f"rank {rank} named rank {late}, which the grader let go {LATE_S:g} s into the report, well in time"
    return None


def blocks_forever(student, reference):
    if error_of(student, "stalled") == DEADLOCK:
        return "while ranks were held, report() had not returned when the grader stopped the ranks"
    return None


def gets_without_checking(student, reference):
    ran(student, "stalled")
    error = error_of(student, "two_groups")
    if error == DEADLOCK or "timeout" in error.lower():
        return ("report() returned while every rank had checked in at least once, but not when one rank had never "
                "checked in on the group")
    return None


def one_counter_for_all_groups(student, reference):
    c = ran(student, "two_groups")["case"]
    both = len(collectives_of(c["steps"], "tp")) + c["hang"]  # a tp member's collectives on both groups
    for rank, report, _ in _reports(student, "two_groups"):
        entry = report["last"][rank] if rank < len(report["last"]) else None
        if rank in c["tp_members"] and entry == [both, collectives_of(c["steps"], "dp")[c["hang"] - 1]]:
            return (f"rank {rank} numbered its collective #{c['hang']} on 'dp' #{both}: the count includes the other "
                    "group's collectives")
    return None


def ignores_group_name(student, reference):
    c = ran(student, "two_groups")["case"]
    others = [[n + 1, kind] for n, kind in enumerate(collectives_of(c["steps"], "tp"))]
    for rank, report, want in _reports(student, "two_groups"):
        for r, (got, right) in enumerate(zip(report["last"], want["last"])):
            if got != right and got in others:
                return f"rank {rank}'s report on 'dp' shows {got} for rank {r}: a collective of the other group"
    return None


def does_nothing(student, reference):
    reports = [r for _, r, _ in _reports(student, "desync")]
    if reports and all(r["last"] in ([], [None] * len(r["last"])) for r in reports):
        return "no rank's report shows any rank's last collective"
    return None


MISTAKES = [
    Mistake("only_first_missing", "You stop at the first rank that has not entered the collective.",
            "When several ranks are stuck (a node of 8 GPUs), the others stay hidden until the next hang.",
            "Compare every rank's sequence number with this rank's own and return all the ranks that are behind.",
            only_first_missing),
    Mistake("blames_rank_0", "You name rank 0 whenever something is missing.",
            "Rank 0 hosts the store and appears in many error messages, but the rank a hang waits for is any rank.",
            "Name the ranks whose last sequence number is below this rank's own.", blames_rank_0),
    Mistake("never_waits", "You read the check-ins once and report at once.",
            "A rank a moment late (still in its backward pass) is then named as if it were stuck.",
            "Read the check-ins again until every rank is there or the deadline has passed.", never_waits),
    Mistake("blocks_forever", "You wait for every rank to check in, with no deadline.",
            "When a rank never comes, the report hangs too: the diagnosis is stuck with the job.",
            "Compute the deadline on entry and return what you found once it has passed.", blocks_forever),
    Mistake("gets_without_checking", "You read a rank's check-in with store.get before it exists.",
            "get waits for a key nobody has written until the store's own timeout, far beyond the deadline.",
            "Check that the key exists first (store.check) and report None for a rank that never checked in.",
            gets_without_checking),
    Mistake("one_counter_for_all_groups", "You count collectives with one counter for every process group.",
            "Each group numbers its own collectives: counted together, the numbers of two groups cannot be compared.",
            "Keep the count in each recorder object, one per group.", one_counter_for_all_groups),
    Mistake("ignores_group_name", "Your check-in keys do not include the group's name.",
            "Two groups share the store, so one group's check-ins overwrite the other's.",
            "Put the group's name in every key the recorder writes and reads.", ignores_group_name),
    Mistake("does_nothing", "Your recorder writes nothing to the store.",
            "The other ranks then cannot see which collective this rank last entered.",
            "Write each check-in to the store in record() and read every rank's in report().", does_nothing,
            includes=EVERY),
]


LOCATE = Locate(names={"report": "the report ({})", "missing": "the ranks named missing",
                       "last": "each rank's last collective"},
                ignore=("forbidden", "held", "returned"))
