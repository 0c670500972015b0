"""Each lesson's run time on this machine: every notebook in solutions/ executed top to bottom, one after another.

    python -m bench.lesson_times [--out coursekit/results/lesson_times.json] [--only lesson1 ...]

Runs each notebook the way `make test` does (nbclient, a fresh kernel, kernel start included) and writes the
wall times with the device, torch version, date and the machine's load average, which say how busy the CPU was.
The start page and the README show this file (coursekit.run_times); tests/notebooks/test_run_times.py checks they agree.
"""
import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient

from coursekit.run_times import TIMES

SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions"


def cpu_model() -> str:
    """The CPU's model name (Linux), so that a reader can compare with their own; the architecture elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return ""


def notebooks() -> list[Path]:
    return sorted(p for p in SOLUTIONS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def run_time(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return time.perf_counter() - start


def superseded(conditions: str, measured: set[str]) -> str:
    """``conditions`` without the notebooks measured again: an earlier "re-measured" clause keeps only the others
    (and goes when none is left)."""
    first, *clauses = conditions.split("; re-measured ")
    kept = []
    for clause in clauses:
        when, _, names = clause.rpartition(": ")
        left = [n for n in names.split(", ") if n not in measured]
        if left:
            kept.append(f"{when}: {', '.join(left)}")
    return "; re-measured ".join([first, *kept])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TIMES)
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="re-measure only the notebooks whose path contains NAME; keep the others' recorded times")
    args = parser.parse_args(argv)
    seconds, loads = {}, []
    for path in notebooks():
        if args.only and not any(name in str(path.relative_to(SOLUTIONS)) for name in args.only):
            continue
        loads.append(os.getloadavg()[0])
        seconds[str(path.relative_to(SOLUTIONS))] = round(run_time(path), 1)
        print(f"{path.name}: {seconds[str(path.relative_to(SOLUTIONS))]:.1f} s", flush=True)
    today = datetime.date.today().isoformat()
    conditions = f"1-minute load average {min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} cores"
    entry = {"device": f"CPU {platform.machine()} {cpu_model()}, {os.cpu_count()} cores", "torch": torch.__version__,
             "date": today, "seconds": seconds,
             "conditions": f"nbclient, one notebook after another, kernel start included; {conditions}"}
    if args.only:  # keep the other notebooks' times, and say which were measured when
        entry = json.loads(args.out.read_text()) if args.out.exists() else entry
        entry["seconds"] = {**entry["seconds"], **seconds}
        entry["conditions"] = superseded(entry["conditions"], set(seconds)) + \
            f"; re-measured {today} ({conditions}): {', '.join(sorted(seconds))}"
    args.out.write_text(json.dumps(entry, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
