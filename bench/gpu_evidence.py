"""Record every GPU result the lessons show, with its provenance. On a GPU machine, from a plain copy of the
repository (no virtual environment, no pip, no git: any ``python3`` that holds PyTorch):

    python3 -m bench.gpu_evidence --out DIR            # every section, on all visible GPUs (make gpu-evidence)
    python3 -m bench.gpu_evidence --out DIR --only lesson2_amp lesson6_mfu
    python3 -m bench.gpu_evidence --out DIR --dry-run  # CPU, gloo, tiny sizes: proves the command works here

It writes ``gpu_evidence.json`` (one entry per section, the format ``coursekit/recorded.py`` reads),
``gpu_evidence.md`` (a table per section) and ``gpu_evidence.log`` (everything the run printed) into DIR, with
the GPU, driver, CUDA, NCCL, torch and Python versions, the commit and the date. Committed results live in
``coursekit/results/`` (package data: the lessons and the student kit read it there): copy the two result files
there (or pass ``--out coursekit/results``).

Bounded: each section gets ``--timeout`` seconds (default 60) and the whole run ``--total-timeout`` (default
480, the 8 minutes a borrowed GPU machine allows); a section that runs out of time is reported and the others
still run. The commit comes from ``GPU_EVIDENCE_COMMIT`` when set, else from git; a torch other than the pinned
one is recorded as a warning next to every result. Sections that need more GPUs than the machine has are
recorded as "needs ≥ N GPUs; not recorded", and the lessons say so.

This module is the supervisor and imports nothing but the standard library: it runs the recorder
(``bench.evidence_record``) as a child process, copies its output to the terminal and the log, and stops it at
the total bound. Sections already in DIR's results file and not re-run are kept, so a short GPU session can
record a few at a time.
"""
import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "coursekit" / "results"
RESULT_FILES = ("gpu_evidence.json", "gpu_evidence.md")
LOG = "gpu_evidence.log"
LOG_LIMIT = 2 << 20  # bytes: the log stays small enough to come back from a borrowed machine
GRACE_S = 20  # after the total bound, before the recorder is killed: it stops on its own first

# name: (title, GPUs the section needs, module of bench that measures it). The names are what the lessons pass
# to coursekit.recorded.show_recorded; each module has a function of the same name.
SECTIONS = {
    "lesson1_accumulation": ("Gradient accumulation: peak memory and time vs micro-batch", 1, "evidence_single"),
    "lesson2_amp": ("Mixed precision: transformer-block step time and memory, fp32/bf16/fp16", 1, "evidence_single"),
    "lesson3_allreduce": ("NCCL all-reduce: bus bandwidth vs message size", 2, "evidence_parallel"),
    "lesson3_data_parallel": ("DDP scaling over the visible GPUs", 2, "evidence_parallel"),
    "lesson4_pipeline_parallel": ("GPipe bubble: measured vs (p-1)/(m+p-1)", 2, "evidence_pipeline"),
    "lesson5_fsdp_zero": ("DDP, ZeRO-1 and FSDP2: memory per rank", 2, "evidence_parallel"),
    "lesson6_comm_share": ("Where a DDP step's time goes: compute, communication, idle", 1, "evidence_parallel"),
    "lesson6_mfu": ("Model FLOPs utilisation of a transformer training step", 1, "evidence_single"),
    "lesson7_attention": ("Fused attention (SDPA) vs naive attention: time and memory vs sequence length", 1,
                          "evidence_single"),
    "lesson7_matmul": ("Matrix-product throughput: float32, bfloat16 and FP8", 1, "evidence_single"),
    "lesson10_kernels": ("Lesson 10's Triton kernels vs PyTorch: fused RMSNorm, FlashAttention forward", 1,
                         "evidence_kernels"),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m bench.gpu_evidence", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the results and the log")
    parser.add_argument("--dry-run", action="store_true", help="run every section on the CPU with tiny sizes")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), help="run only these sections")
    parser.add_argument("--ranks", type=int, help="GPUs to use (default: all visible; dry run: 2 CPU ranks)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per section (default 60)")
    parser.add_argument("--total-timeout", type=float, default=480.0, help="seconds for the whole run (default 480)")
    return parser.parse_args(argv)


# ---- the results files (written by the recorder after every section) ---------------------------------------

def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else str(value)


def markdown(results: dict) -> str:
    prov = results.get("provenance", {})
    lines = ["# Recorded GPU results", "",
             "Written by `python3 -m bench.gpu_evidence`; the lessons show these as *recorded*, never as computed "
             "on the reader's machine.", "", "| provenance | |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in prov.items()]
    for name, (title, _, _) in SECTIONS.items():
        entry = results.get(name)
        if not isinstance(entry, dict):
            continue
        lines += ["", f"## {title} (`{name}`)", "",
                  f"{entry.get('device')} · torch {entry.get('torch')} · CUDA {entry.get('cuda')} · "
                  f"driver {entry.get('driver')} · {entry.get('date')}", ""]
        if entry.get("needs GPUs"):
            lines += [f"needs ≥ {entry['needs GPUs']} GPUs; not recorded ({entry.get('gpus')} visible)"]
        rows = entry.get("rows") or []
        if rows:
            columns = list(dict.fromkeys(k for r in rows for k in r))
            lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
        for key in ("setup", "notes", "warning"):
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


# ---- the supervisor ------------------------------------------------------------------------------------------

class Log:
    """Copies the recorder's output to the terminal and to the log file (up to LOG_LIMIT bytes)."""

    def __init__(self, path: Path):
        self.file, self.written = path.open("w", encoding="utf-8", errors="replace"), 0

    def line(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        size = len(text.encode("utf-8", errors="replace"))
        if self.written < LOG_LIMIT:
            self.file.write(text if self.written + size < LOG_LIMIT else "[log truncated here]\n")
            self.file.flush()
            self.written += size

    def follow(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            self.line(raw.decode("utf-8", errors="replace"))


def _stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    out = args.out.resolve()
    if args.dry_run and out == RESULTS.resolve():
        print("a dry run never writes to coursekit/results: choose another --out", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / LOG)
    log.line(f"[{_stamp()}] python3 -m bench.gpu_evidence {' '.join(argv)}\n")
    started = time.monotonic()
    recorder = subprocess.Popen([sys.executable, "-u", "-m", "bench.evidence_record", *argv], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    follower = threading.Thread(target=log.follow, args=(recorder.stdout,), daemon=True)
    follower.start()
    try:
        code = recorder.wait(timeout=args.total_timeout + GRACE_S)
    except subprocess.TimeoutExpired:  # hung in something no per-section bound reached: stop it and its ranks
        code = 124
        log.line(f"[{_stamp()}] stopped: the run passed its total bound of {args.total_timeout:.0f} s\n")
    finally:  # also on Ctrl-C: the recorder runs in its own session, so the terminal's signal never reaches it
        if recorder.poll() is None:
            os.killpg(recorder.pid, signal.SIGKILL)
            recorder.wait()
    follower.join(timeout=5)
    if not all((out / name).exists() for name in RESULT_FILES):  # the recorder never got to write: say why
        write({"provenance": {"error": f"the recorder wrote no results (exit status {code}); see {LOG}",
                              "command": "python3 -m bench.gpu_evidence " + " ".join(argv), "date": _stamp()}}, out)
    sizes = ", ".join(f"{name} {(out / name).stat().st_size / 1024:.0f} KiB" for name in (*RESULT_FILES, LOG))
    log.line(f"[{_stamp()}] done in {time.monotonic() - started:.0f} s, exit status {code}: {out}: {sizes}\n")
    log.file.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
