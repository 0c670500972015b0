"""Grading under one identity (every worker under the grader's own uid, no subordinate uids): this checkout against
another, side by side (issue 41: a one-identity worker started a fresh sandbox, and imported torch, per student).

    sudo python -m bench.one_identity_reuse --baseline /tmp/old-checkout [--students 8] [--rounds 2]

Each round grades ``--students`` students one after another (the reference of a plain and of a rank exercise each,
through ``isolation.run_isolated``, so the rank exercise runs alone) in a fresh process of each checkout, the two
alternating so that both see the same machine load; workers run as this (root) uid with no cgroup of their own, the
sandbox a one-identity grader gets. CPU seconds are the whole process tree's (a cpuacct group: the killed sandboxes'
CPU, which no parent collects, included), so the script needs root and a cgroup v1 cpuacct hierarchy. Prints and
records (``--out``, default bench/results/grading_one_identity_reuse_cpu.json) the median wall and CPU seconds per
checkout, with the load average.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CPUACCT = Path("/sys/fs/cgroup/cpuacct")

_GRADER = """
import json, os, sys, time
from dataclasses import replace
from autograder.authoring.class_builder import reference_source
from autograder.authoring.course import load_course
from autograder.grader.isolation import run_isolated
from autograder.grader.runner import Task, close_idle_workers
from autograder.grader.sandbox.cgroups import CgroupPlan
from autograder.grader.sandbox.launch import make_sandbox

group = sys.argv[2]
with open(f"{group}/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
box = replace(make_sandbox(gpu=False), uid=None, uids=None, subids=None, cgroups=CgroupPlan(""))
course = load_course()

def task(student, exercise):
    spec = course.spec_for_exercise(exercise)
    cells = tuple((f"setup {i}", c) for i, c in enumerate(spec.setup_code))
    return Task(f"{student}-{exercise}", exercise, cells + (("your cell", reference_source(exercise)),), 120.0, 0)

started, ok = time.monotonic(), 0
for student in range(int(sys.argv[1])):
    results, _ = run_isolated([task(student, "train_with_accumulation"), task(student, "average_gradients")], box)
    ok += sum(r.status == "ok" for r in results.values())
close_idle_workers()
print(json.dumps({"ok": ok, "wall_s": time.monotonic() - started}))
"""


def _grade(checkout: Path, students: int) -> dict:
    group = CPUACCT / f"bench-one-identity-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONDONTWRITEBYTECODE": "1"}
        run = subprocess.run([sys.executable, "-c", _GRADER, str(students), str(group)], capture_output=True,
                             text=True, env=env, cwd=checkout, timeout=1800)
        time.sleep(1)  # the last sandbox's processes end after the grader's exit
        found = json.loads(run.stdout.strip().splitlines()[-1])
        found["cpu_s"] = int((group / "cpuacct.usage").read_text()) / 1e9
        return found
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            (CPUACCT / "cgroup.procs").write_text(pid)
        group.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--students", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/grading_one_identity_reuse_cpu.json")
    args = parser.parse_args()
    runs = {"baseline": [], "this": []}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for name, checkout in (("baseline", args.baseline), ("this", REPO)):
            runs[name].append(_grade(checkout.resolve(), args.students))
            loads.append(os.getloadavg()[0])
            print(name, runs[name][-1], f"load {loads[-1]:.1f}", flush=True)
    summary = {name: {key: round(statistics.median(r[key] for r in found), 1) for key in ("wall_s", "cpu_s")}
               for name, found in runs.items()}
    summary["cpu_ratio"] = round(summary["baseline"]["cpu_s"] / summary["this"]["cpu_s"], 1)
    record = {"students": args.students, "rounds": args.rounds, "load_average": [round(x, 1) for x in loads],
              "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "median": summary, "runs": runs}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
