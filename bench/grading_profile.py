"""Where a correct student-exercise's CPU goes, as the grading worker spends it (issue 41's profile).

    python -m bench.grading_profile [--exercises BucketedDDP MiniFSDP ...] [--rounds 3] [--out FILE]

A process set up like the worker's zygote (``worker.preload``, every observer imported, its memory collapsed into
huge pages) forks one task per exercise, as the worker does; the task observes the reference solution (rank
exercises: forks the ranks, which define it themselves). The zygote reads each task's CPU from ``getrusage``:
the task's own (the launcher: forks, the meter) and its reaped descendants' (the ranks), user and system time
apart, and their minor page faults (each a zeroed or copied 4 KiB page). It also times launches of an empty target
(fork, join the group, exit), the fixed cost of every launch. Medians of ``--rounds``. No sandbox here (its
isolation of each rank adds to these); CPU seconds, which other work on the machine inflates less than wall time.
"""
import argparse
import json
import os
import resource
import statistics
import sys
from pathlib import Path

from coursekit import describe_device

REPO = Path(__file__).resolve().parent.parent


def _usage() -> dict:
    own, ranks = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"launcher_user_s": own.ru_utime, "launcher_sys_s": own.ru_stime, "launcher_faults": own.ru_minflt,
            "ranks_user_s": ranks.ru_utime, "ranks_sys_s": ranks.ru_stime, "ranks_faults": ranks.ru_minflt}


def in_a_child(fn) -> dict:
    """``fn()`` (a dict of JSON data) computed in a forked child, as the worker runs a task."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        os.write(write_fd, json.dumps(fn()).encode())
        os._exit(0)
    os.close(write_fd)
    data = b""
    while chunk := os.read(read_fd, 1 << 16):
        data += chunk
    os.close(read_fd)
    os.waitpid(pid, 0)
    return json.loads(data)


def _in_a_task(work) -> dict:
    """Run ``work()`` in a forked child, as the worker runs a task; the child's usage and its descendants'."""
    def measured() -> dict:
        counted = {"launches": 0, "ranks": 0}
        before = _usage()
        work(counted)
        after = _usage()
        return {k: after[k] - before[k] for k in after} | counted

    return in_a_child(measured)


def _observe(exercise: str, cells: list, salt: int):
    from autograder.exercises import get_exercise
    from autograder.exercises.beside import ranks
    from autograder.exercises.beside.define import define_function
    from autograder.exercises.beside.meter import Meter
    from autograder.exercises.beside.observing import observe

    def work(counted):
        start = Meter.start

        def counting(meter, pids):  # every launch starts one meter, whoever launches (run_on_ranks, run_alone)
            counted["launches"] += 1
            counted["ranks"] += len(pids)
            return start(meter, pids)

        Meter.start = counting
        ex = get_exercise(exercise)
        fn = ranks.Deferred(cells, exercise) if ex.ranks else define_function(cells, exercise)
        observe(ex, fn, salt=salt)
    return work


def _empty_launches(world_size: int, times: int):
    from autograder.exercises.beside import ranks

    def nothing(rank, world_size):
        return 0

    def work(counted):
        ranks.return_freed_memory()
        ranks.run_on_ranks(nothing, world_size, group=world_size > 1)  # the first launch warms gloo
        before = _usage()
        for _ in range(times):
            ranks.run_on_ranks(nothing, world_size, group=world_size > 1)
        after = _usage()
        counted.update({k: (after[k] - before[k]) / times for k in after}, launches=1, ranks=world_size)
    return work


def _median(runs: list[dict]) -> dict:
    return {k: round(statistics.median(r[k] for r in runs), 4) for k in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exercises", nargs="*", help="default: every exercise")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the numbers here")
    args = parser.parse_args()

    import torch

    from autograder.authoring.course import load_course
    from autograder.exercises import all_exercises
    from autograder.exercises.beside.observing import observer_of
    from autograder.grader.sandbox.hugepages import collapse_anonymous_memory
    from autograder.grader.sandbox.worker import preload

    machine = describe_device("cpu")  # before the zygote's one thread
    torch.set_num_threads(1)
    for exercise in all_exercises().values():  # the zygote's set-up (worker.main)
        observer_of(exercise)
    preload()
    collapsed = collapse_anonymous_memory()
    names = args.exercises or list(all_exercises())
    cells = {name: load_course().reference_cells(name) for name in names}
    per_exercise = {name: [] for name in names}
    empty = {ws: [] for ws in (1, 2, 4)}
    for name in names:
        _in_a_task(_observe(name, cells[name], salt=1))  # warm: files read, the profiler's first start
    for round_ in range(args.rounds):
        for name in names:
            per_exercise[name].append(_in_a_task(_observe(name, cells[name], salt=round_ + 2)))
        for ws in empty:
            empty[ws].append(_in_a_task(_empty_launches(ws, 10)))
    rows = {name: _median(runs) for name, runs in per_exercise.items()}
    for row in [*rows.values()]:
        row["cpu_s"] = round(sum(v for k, v in row.items() if k.endswith("_s")), 3)
    result = {"machine": machine, "load_average_1min": round(os.getloadavg()[0], 2),
              "zygote_collapsed_mib": collapsed >> 20, "rounds": args.rounds,
              "per_exercise": rows, "empty_launch_by_world_size": {ws: _median(runs) for ws, runs in empty.items()}}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
