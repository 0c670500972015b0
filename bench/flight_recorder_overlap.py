"""FlightRecorder's three launches one after another (as before) or at the same time (``together``), side by side.

    python -m bench.flight_recorder_overlap wall [--rounds 5]
    python -m bench.flight_recorder_overlap verdicts [--runs 30] [--one-after-another]

``wall``: a process set up like the worker's zygote (bench/grading_profile.py) forks one task per observation of the
reference, alternating the two ways; each task's wall time and CPU seconds (its own and its ranks', from
``getrusage``). Medians; the load average beside them.

``verdicts``: the timing of the scenarios (the late rank let go LATE_S into a deadline of DEADLINE_S, held ranks
beyond it) must hold on a loaded machine. Each run observes the reference and every variant of
tests/variants/flight_recorder.py (``not_implemented`` aside) on the public scenarios or on a held-out salt,
alternating, grades and diagnoses them, and compares the checks failed and the causes named with the first run's on
the same salt. Run it beside other load (for example two ``nice -n 19`` busy
loops); it counts the runs whose verdict changed.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

EXERCISE = "FlightRecorder"


def _one_after_another(on: bool) -> None:
    """As before ``together``: the exercise's launches one after another (its observe's ``together`` dropped)."""
    import autograder.exercises.flight_recorder.observe as observer
    from autograder.exercises.beside import ranks

    observer.observe_on_ranks = (lambda *a, **k: ranks.observe_on_ranks(*a, **{**k, "together": False})) if on \
        else ranks.observe_on_ranks


def _in_a_task(work) -> dict:
    """``work()`` in a forked child, as the worker runs a task: its wall time, and its CPU with its descendants'."""
    from bench.grading_profile import in_a_child

    def measured() -> dict:
        own, ranks = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        extra = work()
        wall = time.monotonic() - start
        own2, ranks2 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = sum(getattr(b, f) - getattr(a, f) for a, b in ((own, own2), (ranks, ranks2))
                  for f in ("ru_utime", "ru_stime"))
        return {"wall_s": wall, "cpu_s": cpu, **extra}

    return in_a_child(measured)


def _zygote():
    """The worker's set-up (worker.main): torch with one thread, every observer imported, memory collapsed."""
    import torch

    from autograder.exercises import all_exercises
    from autograder.exercises.beside.observing import observer_of
    from autograder.grader.sandbox.hugepages import collapse_anonymous_memory
    from autograder.grader.sandbox.worker import preload

    torch.set_num_threads(1)
    for exercise in all_exercises().values():
        observer_of(exercise)
    preload()
    collapse_anonymous_memory()


def wall(rounds: int) -> dict:
    from autograder.authoring.course import load_course
    from autograder.exercises import get_exercise
    from autograder.exercises.beside import ranks
    from autograder.exercises.beside.observing import observe

    _zygote()
    cells = load_course().reference_cells(EXERCISE)

    def observation(salt):
        def work():
            found = observe(get_exercise(EXERCISE), ranks.Deferred(cells, EXERCISE), salt=salt)
            return {"errors": [s.get("error") for s in found["scenarios"].values() if s.get("error")]}
        return work

    runs = {"one_after_another": [], "together": []}
    loads = []
    for round_ in range(rounds + 1):
        for way in runs:
            _one_after_another(way == "one_after_another")
            found = _in_a_task(observation(salt=round_ + 1))
            if round_:  # the first round warms (files read, gloo's first start)
                runs[way].append(found)
        loads.append(os.getloadavg()[0])
    return {"rounds": rounds, "load_average_1min": [round(x, 2) for x in loads],
            **{way: {"wall_s_median": round(statistics.median(r["wall_s"] for r in found), 3),
                     "cpu_s_median": round(statistics.median(r["cpu_s"] for r in found), 3),
                     "wall_s": [round(r["wall_s"], 3) for r in found],
                     "errors": sum(len(r["errors"]) for r in found)}
               for way, found in runs.items()}}


def verdicts(runs: int, one_after_another: bool) -> dict:
    sys.path.insert(0, "tests")  # run from the repository's root, as every bench
    from variants import HELD_OUT_SALTS
    from variants import flight_recorder as suite

    from autograder.authoring.course import load_course, reference_function
    from autograder.exercises import get_exercise
    from autograder.exercises.beside.define import define_function
    from autograder.exercises.beside.observing import observe
    from autograder.exercises.judging.diagnosis import diagnose

    _one_after_another(one_after_another)
    ex, spec = get_exercise(EXERCISE), load_course().spec_for_exercise(EXERCISE)
    sources = {f"correct/{n}": s for n, s in suite.CORRECT.items()}
    sources |= {f"wrong/{n}": s for n, (s, _) in suite.WRONG.items() if n != "not_implemented"}

    def verdict(salt: int) -> dict:
        reference = json.loads(json.dumps(observe(ex, reference_function(EXERCISE), salt=salt, as_reference=True)))
        out = {"reference": tuple(r.title for r in ex.grade(reference, reference) if not r.passed)}
        for name, source in sources.items():
            fn = define_function([("setup", c) for c in spec.setup_code] + [("student cell", source)], EXERCISE)
            student = json.loads(json.dumps(observe(ex, fn, salt=salt)))
            results = ex.grade(student, reference)
            diagnosis = diagnose(ex, student, reference, results)
            out[name] = (tuple(r.title for r in results if not r.passed), diagnosis.cause_id)
        return out

    first, changed, seconds, judged = {}, Counter(), [], 0
    for run in range(runs):
        salt = 0 if run % 2 == 0 else HELD_OUT_SALTS[(run // 2) % len(HELD_OUT_SALTS)]
        start = time.monotonic()
        found = verdict(salt)
        seconds.append(time.monotonic() - start)
        judged += len(found)
        for name, got in found.items():
            key = f"{name} (salt {salt})"  # each salt's scenarios are their own: a verdict is compared per salt
            first.setdefault(key, got)
            if got != first[key]:
                changed[key] += 1
                print(f"run {run}: {key} changed: {got} (first: {first[key]})", file=sys.stderr)
        print(f"run {run} salt {salt}: {time.monotonic() - start:.1f} s, load {os.getloadavg()[0]:.2f}, "
              f"changed so far {sum(changed.values())}", file=sys.stderr, flush=True)
    return {"runs": runs, "way": "one after another" if one_after_another else "together",
            "verdicts_judged": judged, "verdicts_changed": dict(changed), "verdicts": first,
            "seconds_per_run_median": round(statistics.median(seconds), 1), "load_average_1min": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("wall").add_argument("--rounds", type=int, default=5)
    v = sub.add_parser("verdicts")
    v.add_argument("--runs", type=int, default=30)
    v.add_argument("--one-after-another", action="store_true", help="the launches as before (for comparison)")
    parser.add_argument("--out", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    result = wall(args.rounds) if args.what == "wall" else verdicts(args.runs, args.one_after_another)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
