"""Observing ``FlightRecorder`` on real ranks: the grader's code calls the collectives, and its launcher holds ranks
from outside (gates) to make a hang happen where the scenario says.

In each rank the grader makes the student's recorder for each group (with the store the ranks share, under a prefix
of the scenario's own) and walks the scenario's steps: before each collective it calls ``record(kind)``, then the
collective itself on that group. A rank the scenario holds asks the launcher's gate first and is held there until
every other rank has reported (it then ends, as a dead rank would never come back); the late rank is let go
``LATE_S`` after the on-time ranks began their reports (together); a desynchronised rank skips a collective. The ranks whose
next collective could not complete call ``report(deadline_s)`` instead of entering it (the late rank with what the
others have left: ``cases.deadline_of``), between two gates of the launcher, which times them from outside.
"""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..beside.meter import GatePolicy
from ..beside.observing import plain
from ..beside.ranks import ask_gate, observe_on_ranks, student_call
from .cases import LATE_S, cases, deadline_of, expected

LAUNCH_S = 8.0   # one scenario; a correct one takes about a second, a report that blocks forever is stopped here
GROUP_S = 5.0    # the groups' own timeout: longer than any correct scenario, shorter than the launch


# ---- inside the ranks ------------------------------------------------------------------------------

def collective(kind: str, group, rank: int) -> None:
    t = torch.ones(2)
    if kind == "all_reduce":
        dist.all_reduce(t, group=group)
    elif kind == "broadcast":
        dist.broadcast(t, src=dist.get_global_rank(group, 0), group=group)
    elif kind == "all_gather":
        dist.all_gather([torch.empty(2) for _ in range(dist.get_world_size(group))], t, group=group)
    else:
        dist.barrier(group=group)


def as_report(value) -> dict:
    """A report as plain data: ``missing`` sorted (any iterable of ranks), ``last`` a list by rank (a dict by rank is
    read as one); anything else kept as it came, for the feedback to describe."""
    if not isinstance(value, dict) or "missing" not in value or "last" not in value:
        return {"missing": None, "last": None, "returned": plain(value if not isinstance(value, dict) else
                                                                 sorted(map(str, value))[:8])}
    missing, last = value["missing"], value["last"]
    try:
        missing = sorted(int(r) for r in missing)
    except (TypeError, ValueError):
        missing = plain(missing)
    if isinstance(last, dict):
        last = [last.get(r, last.get(str(r))) for r in range(len(last))]
    return {"missing": missing, "last": plain(last, sizes=(16, 2)), "returned": "dict"}


def rank_target(rank: int, world_size: int, cls, case: dict) -> dict:
    store = dist.PrefixStore(f"flight-recorder/{case['what']}/", dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=GROUP_S)))
    groups = {"dp": dist.new_group(backend="gloo", timeout=timedelta(seconds=GROUP_S))}
    if case["tp_members"]:
        tp = dist.new_group(case["tp_members"], backend="gloo", timeout=timedelta(seconds=GROUP_S))
        if rank in case["tp_members"]:
            groups["tp"] = tp
    recorders = {name: student_call(cls, store, group, name) for name, group in groups.items()}
    dp_seq = 0
    for group_name, kind in case["steps"]:
        if group_name not in groups:
            continue
        if group_name == "dp":
            dp_seq += 1
            if dp_seq == case["hang"] and rank == case["skips"]:
                continue  # desynchronised: this rank goes on to the next collective
            if dp_seq == case["hang"] and rank in case["held"]:
                ask_gate("held", torch.ones(1))  # let go only once every other rank has reported
                return finish({"held": True})
            if dp_seq == case["hang"] and rank == case["late"]:
                ask_gate("late", torch.ones(1))
        student_call(recorders[group_name].record, kind)
        if group_name == "dp" and (dp_seq == case["hang"] or (rank == case["skips"] and dp_seq == case["hang"] + 1)):
            ask_gate("reporting", torch.ones(1))
            report = student_call(recorders["dp"].report, deadline_of(case, rank))
            ask_gate("reported", torch.ones(1))
            return finish({"report": as_report(report)})
        collective(kind, groups[group_name], rank)
    return finish({"report": None})


def finish(record: dict) -> dict:
    """Every rank ends together (the store lives in rank 0), on the grader's own group."""
    dist.barrier()
    return record


# ---- the launcher's side ---------------------------------------------------------------------------

class HoldAndRelease(GatePolicy):
    """The scenario's hang, made from outside: the on-time reporting ranks start their reports together (once all of
    them have checked in); the late rank is let go LATE_S after that; the held ranks wait at their gate until every
    reporting rank has passed its ``reported`` gate. Records how long each report took (the launcher's clock)."""

    tick_s = 0.01

    def __init__(self, case: dict):
        super().__init__(case["world_size"])
        self.reporters = len(expected(case))
        self.on_time = self.reporters - (case["late"] is not None)
        self.held, self.late, self.ready, self.go = [], None, [], None
        self.started, self.ended = {}, {}

    def request(self, rank: int, request, meter) -> list[tuple[int, float]]:
        self.record(rank, request, meter)
        gate = request.get("gate") if isinstance(request, dict) else None
        now = time.monotonic()
        if gate == "held":
            self.held.append(rank)
            return self._release_held()
        if gate == "late":
            self.late = rank
            return self.tick(meter)
        if gate == "reporting":
            self.started[rank] = now
            if self.go is None:  # an on-time rank: all of them start together
                self.ready.append(rank)
                if len(self.ready) < self.on_time:
                    return []
                self.go = now
                return [(r, 1.0) for r in self.ready] + self.tick(meter)
        elif gate == "reported":
            self.ended[rank] = now
        return [(rank, 1.0)] + self._release_held()

    def _release_held(self) -> list[tuple[int, float]]:
        if len(self.ended) < self.reporters:
            return []
        out, self.held = [(r, 1.0) for r in self.held], []
        return out

    def tick(self, meter) -> list[tuple[int, float]]:
        if self.late is not None and self.go is not None and time.monotonic() - self.go >= LATE_S:
            late, self.late = self.late, None
            return [(late, 1.0)]
        return []

    def result(self) -> dict:
        return {"report_s": {str(r): round(self.ended[r] - self.started[r], 3) for r in self.ended if r in self.started}}


def observe(fn, *, salt: int = 0) -> dict:
    return observe_on_ranks(salt, cases(salt), rank_target, fn, gates=HoldAndRelease, timeout=LAUNCH_S, quiet=True,
                            together=True)
