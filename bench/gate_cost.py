"""What an exercise's observation costs, this checkout against another, side by side (issue 37's gates the launcher
answers: its recomputation of every gate runs in the launching process).

    python -m bench.gate_cost --baseline /tmp/old-checkout [--exercises MiniFSDP BucketedDDP] [--rounds 3]

Each round observes the reference solution of every exercise ``--per-round`` times in a fresh process of each
checkout, the two alternating so that both see the same machine load; prints and records the fastest and the median
observation per exercise and its median CPU seconds (user + sys of the observing process and its ranks, which the
load changes little) (``--out``, default bench/results/grading_gates_cpu.json), with the machine, torch version,
date and the load average.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from coursekit import describe_device

REPO = Path(__file__).resolve().parent.parent

_TIMER = """
import json, sys, time
sys.path.insert(0, "tests")
from autograder.authoring.course import load_course
from autograder.exercises import get_exercise
from autograder.exercises.beside.define import define_function
from autograder.exercises.beside.observing import observe
exercise, times = sys.argv[1], int(sys.argv[2])
spec = load_course().spec_for_exercise(exercise)
from submission_factory import reference_source
fn = define_function([("setup", c) for c in spec.setup_code] + [("student cell", reference_source(exercise))], exercise)
observe(get_exercise(exercise), fn, salt=1)  # warm: imports, the profiler, first forks
import resource
def cpu():  # user + sys of this process and its reaped ranks: what the observation costs, whatever the load
    mine, ranks = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + ranks.ru_utime + ranks.ru_stime
found = []
for _ in range(times):
    start, used = time.perf_counter(), cpu()
    observe(get_exercise(exercise), fn, salt=1)
    found.append([time.perf_counter() - start, cpu() - used])
print(json.dumps(found))
"""


def observe_times(checkout: Path, exercise: str, times: int) -> list[list[float]]:
    """(wall seconds, CPU seconds) of each observation."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", _TIMER, exercise, str(times)], cwd=checkout, env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


GATED = {"MiniFSDP": ("mini_fsdp", "memory", 7, "expected_gates"),
         "BucketedDDP": ("bucketed_ddp", "overlap", 5, "expected_gates"),
         "ShardedOptimizer": ("sharded_optimizer", "memory", 2, "expected_steps"),
         "TensorParallelMLP": ("tensor_parallel_mlp", "traffic", 1, "expected_passes")}


def recomputation_times(exercise: str, times: int = 5) -> list[float]:
    """The launcher's recomputation of a gated scenario's gates alone (this checkout), in this process."""
    import importlib

    package, scenario, gates, recomputation = GATED[exercise]
    observer = importlib.import_module(f"autograder.exercises.{package}.observe")
    case = observer.cases(1)[scenario]
    found = []
    for _ in range(times):
        start = time.perf_counter()
        getattr(observer, recomputation)(case)([[5] * gates] * case["world_size"])
        found.append(round(time.perf_counter() - start, 3))
    return found


def rerun_times(exercise: str, times: int = 5) -> list[float]:
    """Checkpointer's recomputation: the run that never failed, recomputed by the launcher itself under a killed
    run's seeds (plain tensors, no ranks: ``observe.never_failed``), timed alone in this process."""
    from autograder.exercises.checkpointer import observe as observer

    case = observer.cases(1)["same_size"]
    every = list(range(case["steps"] + 1))
    found = []
    for _ in range(times):
        start = time.perf_counter()
        observer.never_failed(case, [5.0] * (case["steps"] - 1), every, every)
        found.append(round(time.perf_counter() - start, 3))
    return found


RERUN = {"Checkpointer": rerun_times}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--exercises", nargs="+", default=["MiniFSDP", "BucketedDDP"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-round", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/grading_gates_cpu.json")
    args = parser.parse_args(argv)
    import torch

    runs = {ex: {"before": [], "after": []} for ex in args.exercises}
    cpus = {ex: {"before": [], "after": []} for ex in args.exercises}
    loads = []
    for _ in range(args.rounds):
        for exercise in args.exercises:
            loads.append(os.getloadavg()[0])
            for when, checkout in (("before", args.baseline), ("after", REPO)):
                for wall, cpu in observe_times(checkout, exercise, args.per_round):
                    runs[exercise][when].append(wall)
                    cpus[exercise][when].append(cpu)
    summary = {ex: {when: {"fastest_s": round(min(t), 3), "median_s": round(statistics.median(t), 3),
                           "runs_s": [round(v, 3) for v in t],
                           "cpu_median_s": round(statistics.median(cpus[ex][when]), 3)}
                     for when, t in r.items()} for ex, r in runs.items()}
    for ex in summary:
        if ex in GATED or ex in RERUN:
            summary[ex]["launcher_recomputation_s"] = (RERUN.get(ex) or recomputation_times)(ex)
    for ex, r in summary.items():
        print(f"{ex}: before {r['before']['fastest_s']} s (median {r['before']['median_s']}), "
              f"after {r['after']['fastest_s']} s (median {r['after']['median_s']})")
    record = {"what": "one observation of the reference solution (held-out salt 1), before and after issue 37's gates "
                      "the launcher answers, alternating processes of the two checkouts",
              "device": describe_device(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "load_average": [round(min(loads), 1), round(max(loads), 1)], "baseline": str(args.baseline),
              "exercises": summary,
              "note": "cpu_median_s: user + sys of the observing process and its ranks (load-independent); "
                      "launcher_recomputation_s: the part the change adds to the launching process, timed alone "
                      "(after the rounds, in the bench's own process); the side-by-side figures are as noisy as the "
                      "machine's load"}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
