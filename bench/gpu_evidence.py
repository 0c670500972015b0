"""Record every GPU result the course shows, with its provenance: ``python -m bench.gpu_evidence``.

On a CUDA machine it runs the GPU path of every lesson and writes ``bench/results/gpu_evidence.json`` (one
entry per section, the format ``coursekit/recorded.py`` reads) and ``bench/results/gpu_evidence.md`` (a table
per section), with the GPU, driver, CUDA, NCCL and torch versions, the commit and the date:

    python -m bench.gpu_evidence                  # every section, on all visible GPUs
    python -m bench.gpu_evidence --only lesson2_amp lesson4_pipeline_parallel --ranks 2
    python -m bench.gpu_evidence --dry-run        # CPU, gloo, tiny sizes: proves the script works

Sections already in the results file and not re-run are kept, so a short GPU session can record a few at a
time. Each section is written as soon as it finishes; a failing section is reported, the others still run,
and the exit status is non-zero. On a machine without CUDA it says so and exits with status 2 (unless
``--dry-run``). A dry run writes to a temporary folder (or ``--out``), never to bench/results.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

# Ask NVML, not the CUDA runtime, whether GPUs exist: cuInit in this process could break CUDA in forked ranks.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch  # noqa: E402

from coursekit.amp_bench import SECTION as AMP_SECTION  # noqa: E402
from coursekit.dist import launch  # noqa: E402

from .evidence_common import Plan  # noqa: E402
from .evidence_parallel import lesson3_allreduce, lesson3_data_parallel, lesson5_fsdp_zero, lesson6_comm_share  # noqa: E402
from .evidence_pipeline import lesson4_pipeline_parallel  # noqa: E402
from .evidence_single import lesson1_accumulation, lesson2_amp  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"

# name: (title, function). The names are what the lessons pass to coursekit.recorded.show_recorded.
SECTIONS = {
    "lesson1_accumulation": ("Gradient accumulation: peak memory and time vs micro-batch", lesson1_accumulation),
    AMP_SECTION: ("Mixed precision: transformer-block step time and memory, fp32/bf16/fp16", lesson2_amp),
    "lesson3_allreduce": ("NCCL all-reduce: bus bandwidth vs message size", lesson3_allreduce),
    "lesson3_data_parallel": ("DDP scaling over the visible GPUs", lesson3_data_parallel),
    "lesson4_pipeline_parallel": ("GPipe bubble: measured vs (p-1)/(m+p-1)", lesson4_pipeline_parallel),
    "lesson5_fsdp_zero": ("FSDP2 vs DDP: memory per rank", lesson5_fsdp_zero),
    "lesson6_comm_share": ("Where a DDP step's time goes: compute, communication, idle", lesson6_comm_share),
}


def _command(*args) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30, cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _device_facts(rank, world_size):
    """Asked inside a forked rank: the recorder's own process must not create a CUDA context."""
    if not torch.cuda.is_available():
        return {"device": f"CPU {platform.machine()}, {os.cpu_count()} cores", "cuda": None, "nccl": None}
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    major, minor = torch.cuda.get_device_capability(0)
    return {"device": names[0], "gpus": names, "capability": f"{major}.{minor}", "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "memory GiB": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}


def provenance(plan: Plan) -> dict:
    facts = launch(_device_facts, 1, backend="gloo", timeout=120)[0]
    driver = _command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").splitlines()
    label = f"{facts['device']} ×{plan.ranks}"
    if plan.dry_run:
        label = f"DRY RUN on CPU ({plan.ranks} gloo ranks, tiny sizes): NOT GPU evidence"
    return {**facts, "label": label, "driver": driver[0] if driver else None, "torch": torch.__version__,
            "python": platform.python_version(), "commit": _command("git", "rev-parse", "--short", "HEAD") or None,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
            "command": "python -m bench.gpu_evidence " + " ".join(sys.argv[1:]), "dry_run": plan.dry_run,
            "ranks": plan.ranks}


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def markdown(results: dict) -> str:
    prov = results.get("provenance", {})
    lines = ["# Recorded GPU results", "",
             "Written by `python -m bench.gpu_evidence`; the lessons show these as *recorded*, never as computed on "
             "the reader's machine.", "",
             "| provenance | |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in prov.items()]
    for name, (title, _) in SECTIONS.items():
        entry = results.get(name)
        if not entry:
            continue
        lines += ["", f"## {title} (`{name}`)", "",
                  f"{entry['device']} · torch {entry['torch']} · CUDA {entry.get('cuda')} · "
                  f"driver {entry.get('driver')} · {entry['date']}", ""]
        rows = entry.get("rows") or []
        if rows:
            columns = list(dict.fromkeys(k for r in rows for k in r))
            lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
        for key in ("setup", "notes"):
            if entry.get(key):
                lines += ["", f"*{key}:* {entry[key]}"]
    return "\n".join(lines) + "\n"


def write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("gpu_evidence.json", json.dumps(results, indent=1, ensure_ascii=False) + "\n"),
                       ("gpu_evidence.md", markdown(results))):
        partial = out / (name + ".partial")
        partial.write_text(text)
        os.replace(partial, out / name)  # never a half-written results file


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="run every section on the CPU with tiny sizes")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), help="run only these sections")
    parser.add_argument("--ranks", type=int, help="GPUs to use (default: all visible; dry run: 2 CPU ranks)")
    parser.add_argument("--out", type=Path, help="output folder (default: bench/results; dry run: a temp folder)")
    args = parser.parse_args(argv)

    if not args.dry_run and not torch.cuda.is_available():
        print(f"No CUDA GPU is visible (torch {torch.__version__}, built for CUDA {torch.version.cuda}). "
              "GPU evidence can only be recorded on a CUDA machine; nothing was written.\n"
              "To check that this script works here, run: python -m bench.gpu_evidence --dry-run", file=sys.stderr)
        return 2
    visible = 2 if args.dry_run else torch.cuda.device_count()
    ranks = args.ranks or visible
    if ranks < 1 or (not args.dry_run and ranks > visible):
        print(f"--ranks must be between 1 and the {visible} visible GPU(s)", file=sys.stderr)
        return 2
    plan = Plan(dry_run=args.dry_run, ranks=ranks)
    out = args.out or (Path(tempfile.mkdtemp(prefix="gpu_evidence_dry_")) if args.dry_run else RESULTS)
    if args.dry_run and out.resolve() == RESULTS.resolve():
        print("a dry run never writes to bench/results: choose another --out", file=sys.stderr)
        return 2

    prov = provenance(plan)
    print(f"Recording on {prov['label']} · torch {prov['torch']} · CUDA {prov.get('cuda')} · "
          f"driver {prov.get('driver')} → {out}", flush=True)
    try:
        results = json.loads((out / "gpu_evidence.json").read_text())
    except (OSError, ValueError):
        results = {}
    results["provenance"] = prov
    failed = []
    for name in args.only or list(SECTIONS):
        title, measure = SECTIONS[name]
        started = time.perf_counter()
        print(f"[{name}] {title} …", flush=True)
        try:
            entry = measure(plan)
        except Exception:  # one failing section must not cost the others their GPU time
            failed.append(name)
            print(f"[{name}] FAILED:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            continue
        results[name] = {"device": prov["label"], "torch": prov["torch"], "date": prov["date"],
                         "cuda": prov.get("cuda"), "driver": prov.get("driver"), "rows": entry["rows"],
                         "setup": entry["setup"], "notes": entry["notes"]}
        write(results, out)
        print(f"[{name}] {len(entry['rows'])} rows in {time.perf_counter() - started:.1f} s", flush=True)
    write(results, out)
    print(f"wrote {out / 'gpu_evidence.json'} and {out / 'gpu_evidence.md'}")
    if failed:
        print(f"sections that failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
