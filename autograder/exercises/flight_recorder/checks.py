"""The checks of ``FlightRecorder``: each rank's report against what the grader made happen (plain Python).

What the grader made happen is in the reference's ``case`` (``cases.expected``): which ranks it held, which one it
let go late, which one skipped a collective. The reports come from the ranks; the times are the launcher's.
"""
from ..judging.checking import ScenarioError, case, rank_results
from .cases import deadline_of, expected

DEADLINE_SLACK_S = 1.5  # a report may end this much after its deadline (a loaded machine) before it "overran"
STALLS = ("stalled", "two_groups")


def stuck(when: str):
    """Reworded: a report that never returned (the launcher's timeout, or the store's own: a get of a key nobody
    wrote waits for it) is the student's wait, not a collective the grader's ranks skipped."""
    def reword(message: str) -> str:
        if "grader stopped them" in message or "wait timeout" in message:
            return (f"When {when}, report() did not return: never wait for a rank without a deadline, and read a "
                    "check-in only once it exists (store.get waits for a key nobody wrote).")
        return message
    return reword


def reports(student, reference, key: str) -> dict[int, dict]:
    """Each reporting rank's report, confirmed to be a dict with both keys; ScenarioError with one sentence if not."""
    c = case(reference, key)
    ranks = rank_results(student, reference, key, reword=stuck(c["what"]))
    out = {}
    for rank in expected(c):
        report = ranks[rank].get("report")
        if not isinstance(report, dict) or report.get("missing") is None or report.get("last") is None:
            returned = report.get("returned") if isinstance(report, dict) else None
            raise ScenarioError(f"When {c['what']}, report() on rank {rank} returned {returned!r}, not a dict with "
                                "the keys 'missing' and 'last'.")
        out[rank] = report
    return out


def check_missing(student, reference):
    for key in STALLS:
        c = case(reference, key)
        for rank, report in reports(student, reference, key).items():
            got, want = report["missing"], expected(c)[rank]["missing"]
            if got == want:
                continue
            held = " and ".join(map(str, want))
            if want and got == want[:1]:
                return (f"When {c['what']}, rank {rank} named only rank {got[0]} as missing, but the grader held ranks "
                        f"{held}: name every rank that has not entered the collective, not the first one found.")
            if got == [0] and 0 not in want:
                return (f"When {c['what']}, rank {rank} blamed rank 0, but the grader held rank(s) {held}: compare "
                        "every rank's sequence number with this rank's own, whoever hosts the store.")
            if c["late"] in got and set(got) - {c["late"]} == set(want):
                continue  # the late rank alone: the next check's mistake
            return (f"When {c['what']}, rank {rank} named {got} as missing, but the grader held rank(s) {held}: a "
                    "rank is missing when its last sequence number in this group is below this rank's own.")
    return None


def check_waits(student, reference):
    c = case(reference, "stalled")
    for rank, report in reports(student, reference, "stalled").items():
        if c["late"] in report["missing"]:
            return (f"When {c['what']}, rank {rank} named rank {c['late']}, which entered the collective within the "
                    f"deadline ({c['deadline_s']:g} s): look again until every rank is there or the deadline has "
                    "passed, not once.")
    return None


def check_returns(student, reference):
    for key in STALLS:
        c = case(reference, key)
        reports(student, reference, key)
        took = student["scenarios"][key]["meter"]["gates"]["report_s"]
        slow = {r: t for r, t in took.items()
                if isinstance(t, int | float) and t > deadline_of(c, int(r)) + DEADLINE_SLACK_S}
        if slow:
            rank, t = next(iter(slow.items()))
            return (f"When {c['what']}, report() on rank {rank} returned after {t:.1f} s, with a deadline of "
                    f"{deadline_of(c, int(rank)):g} s: stop waiting once the deadline has passed.")
    return None


def last_entries(student, reference, key: str) -> str | None:
    c = case(reference, key)
    for rank, report in reports(student, reference, key).items():
        want, got = expected(c)[rank]["last"], report["last"]
        if got != want:
            wrong = next((r for r, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
            said = got[wrong] if wrong < len(got) else "nothing"
            return (f"When {c['what']}, rank {rank} reported {said} as rank {wrong}'s last collective, which is not the "
                    "collective that rank last entered: record [sequence number, kind] per rank, counting from 1 in "
                    "each rank.")
    return None


def check_last(student, reference):
    return last_entries(student, reference, "stalled") or last_entries(student, reference, "desync")


def check_groups(student, reference):
    c = case(reference, "two_groups")
    for rank, report in reports(student, reference, "two_groups").items():
        if report["last"] != expected(c)[rank]["last"]:
            return (f"When {c['what']}, rank {rank}'s report on the group '{c['steps'][-1][0]}' mixed in the other "
                    "group's collectives: count and store each group's sequence numbers under its own name.")
    return None


def store_was_read(got: dict, want: dict) -> str | None:
    """The evidence: some rank reported another rank's last collective as it was (only the store, written by that
    other process, could tell it; the held-out scenarios change the kinds, the ranks and the point of the hang)."""
    ranks = got.get("ranks") if isinstance(got.get("ranks"), list) else []
    for rank, right in expected(want["case"]).items():
        report = ranks[rank].get("report") if rank < len(ranks) and isinstance(ranks[rank], dict) else None
        last = report.get("last") if isinstance(report, dict) else None
        if isinstance(last, list) and any(other != rank and entry is not None and other < len(last) and
                                          last[other] == entry for other, entry in enumerate(right["last"])):
            return None
    return f"when {want['case']['what']}, no rank reported another rank's last collective as it was."
