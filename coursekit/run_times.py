"""How long each lesson takes to run top to bottom: one recorded file, shown with where and when it was measured.

``coursekit/results/lesson_times.json`` (written by ``python -m bench.lesson_times``) is the only source of run
times: the start page prints it with ``show_run_times()``, and a test checks that the README's table says the same.
Your own run time depends on your CPU and on what else it is doing.
"""
import json
from pathlib import Path

TIMES = Path(__file__).resolve().parent / "results" / "lesson_times.json"


def load_run_times() -> dict | None:
    """The recorded entry ({"device", "torch", "date", "conditions", "seconds": {notebook: s}}), or None."""
    try:
        entry = json.loads(TIMES.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("seconds"), dict):
        return None
    return entry


def format_seconds(seconds: float) -> str:
    """How every run time is written, on the start page and in the README alike."""
    return f"{seconds:.0f} s"


def show_run_times() -> dict | None:
    """Print each lesson's recorded run time with its provenance."""
    entry = load_run_times()
    if entry is None:
        print("No lesson run times recorded yet (`python -m bench.lesson_times` records them).")
        return None
    print(f"Run → Run All Cells, RECORDED on {entry.get('device', '?')} · torch {entry.get('torch', '?')} · "
          f"{entry.get('date', '?')} (not measured on this machine)")
    if entry.get("conditions"):
        print(f"  conditions: {entry['conditions']}")
    width = max(len(name) for name in entry["seconds"])
    for name, seconds in entry["seconds"].items():
        print(f"  {name:<{width}}  {format_seconds(seconds):>6}")
    return entry
