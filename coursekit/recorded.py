"""GPU results recorded on a real GPU (``python3 -m bench.gpu_evidence --out DIR``), shown as *recorded*, never as computed here.

``coursekit/results/gpu_evidence.json`` (package data: it ships with the lessons, also in the student kit) holds
one entry per section, e.g.::

    {"lesson3_data_parallel": {"device": "NVIDIA H100 80GB HBM3 ×8", "torch": "2.13.0+cu128",
                               "date": "2026-05-01", "rows": [{"ranks": 1, "samples/s": 81234.0}, ...],
                               "notes": "optional one-line remark"}}

A section that needs more GPUs than the recording machine had is stored without rows, as
``{"needs GPUs": 2, "gpus": 1, ...}``, so that the lesson says so instead of showing numbers that mean nothing.

Lessons call ``show_recorded(section, title)``: a labelled table with its provenance, "needs ≥ 2 GPUs; not
recorded", or a plain "no GPU results recorded yet" when the file or the section is missing.
"""
import json
from pathlib import Path

EVIDENCE = Path(__file__).resolve().parent / "results" / "gpu_evidence.json"


def load_recorded(section: str) -> dict | None:
    """The recorded entry for ``section``, or None when nothing was recorded (or the file is unreadable)."""
    try:
        evidence = json.loads(EVIDENCE.read_text())
        entry = evidence.get(section)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(entry, dict):
        return None
    # Provenance may be recorded once for the whole file rather than per section.
    shared = {k: evidence[k] for k in ("device", "torch", "date") if isinstance(evidence.get(k), str)}
    return {**shared, **entry}


def _cell(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def show_recorded(section: str, title: str) -> dict | None:
    """Print the recorded results of ``section`` as a table labelled with device, torch and date."""
    entry = load_recorded(section)
    if entry is None:
        print(f"{title}: no GPU results recorded yet (`make gpu-evidence` on a GPU machine records them).")
        return None
    provenance = f"{entry.get('device', '?')} · torch {entry.get('torch', '?')} · {entry.get('date', '?')}"
    if entry.get("needs GPUs"):
        print(f"{title}: needs ≥ {entry['needs GPUs']} GPUs; not recorded (the recording machine had "
              f"{entry.get('gpus', '?')}: {provenance})")
        return entry
    print(f"{title} — RECORDED on {provenance} (not measured on this machine)")
    rows = entry.get("rows") or []
    if rows and all(isinstance(r, dict) for r in rows):
        columns = list(dict.fromkeys(k for r in rows for k in r))
        widths = [max(len(c), *(len(_cell(r.get(c, ""))) for r in rows)) for c in columns]
        print("  " + "  ".join(c.rjust(w) for c, w in zip(columns, widths)))
        for r in rows:
            print("  " + "  ".join(_cell(r.get(c, "")).rjust(w) for c, w in zip(columns, widths)))
    for key, value in entry.items():
        if key not in ("device", "torch", "date", "rows"):
            print(f"  {key}: {_cell(value)}")
    return entry
