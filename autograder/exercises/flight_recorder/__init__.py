"""Lesson 9 exercise: ``FlightRecorder``, finding the rank a hung collective waits for, from check-ins in the store.

``FlightRecorder(store, group, name)`` on every rank of ``group``: ``record(kind)`` right before the rank enters a
collective on the group, ``report(deadline_s) -> {"missing": [...], "last": [...]}`` when a collective does not
complete: the ranks (numbered in the group) that have not entered this rank's newest collective once every rank is
there or the deadline has passed, and each rank's last collective as ``[sequence number, kind]``, what NCCL's
flight recorder keeps.

The grader's code calls the collectives on 4 forked gloo ranks; its launcher makes the hang from outside: it holds
ranks at a gate before a collective until every other rank has reported, lets one go late (well inside the
deadline; its report gets what the others have left), or the grader's code skips a collective on one rank; in one
scenario two groups' collectives interleave.
Each reporting rank's report is compared with what the grader made happen (``cases.expected``); the launcher times
each report from outside, and a report that never returns is stopped by the launch's timeout (no process is left).
The three scenarios' launches run at the same time (``observe_on_ranks(together=True)``): each mostly waits out a
deadline, so their waits overlap; each keeps its own ranks, store, gates, clock and timeout: its evidence is its own.
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="FlightRecorder",
    notebook="09_failures.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    ranks=True,
    evidence=checks.store_was_read,
    timeout_s=45,  # three launches at once (one more, alone, if a rank crashes); a report that blocks forever
                   # spends observe.LAUNCH_S
    # the notebook's setup cell (Checkpointer's) imports torch.distributed.checkpoint, which imports parts of FSDP
    # and tensor parallelism: graded in the worker that keeps them, as Checkpointer is
    needs_libraries=("torch/distributed/fsdp", "torch/distributed/tensor/parallel"),
    checks=[
        Check("Names every rank that has not entered the collective, and no other", 3, checks.check_missing,
              evidence=("stalled", "two_groups")),
        Check("Waits up to the deadline: a rank that arrives in time is not named", 1, checks.check_waits,
              evidence=("stalled",)),
        Check("Returns by its deadline while ranks are missing (never blocks itself)", 2, checks.check_returns,
              evidence=("stalled", "two_groups")),
        Check("Reports each rank's last collective: its sequence number and kind", 2, checks.check_last),
        Check("Keeps each process group's sequence numbers apart", 2, checks.check_groups),
    ],
)
