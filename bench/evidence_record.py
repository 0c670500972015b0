"""The recorder itself, started by ``python3 -m bench.gpu_evidence`` (the supervisor): provenance, then every
section within its time bound, the results files rewritten after each one.

This process never initialises CUDA: it asks NVML how many GPUs there are, and every measurement, the device
facts included, runs in ranks forked by ``coursekit.dist.launch``.
"""
import datetime
import hashlib
import importlib
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

# Ask NVML, not the CUDA runtime, whether GPUs exist: cuInit in this process would break CUDA in forked ranks.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch  # noqa: E402

from coursekit.dist import launch  # noqa: E402

from .evidence_common import Plan  # noqa: E402
from .gpu_evidence import REPO, SECTIONS, parse_args, write  # noqa: E402

COMMIT_VARIABLE = "GPU_EVIDENCE_COMMIT"
FINISH_S = 10  # seconds kept back from the total bound to write the results


def _command(*args) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30, cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def pinned_torch() -> str | None:
    """The torch version pyproject.toml pins (``torch==X``)."""
    try:
        found = re.search(r'"torch==([^"]+)"', (REPO / "pyproject.toml").read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def commit() -> str | None:
    """The commit the code comes from: ``GPU_EVIDENCE_COMMIT`` when set (a copy without git), else git's."""
    return os.environ.get(COMMIT_VARIABLE) or _command("git", "rev-parse", "--short", "HEAD") or None


def sources_sha256() -> str:
    """A hash of the recorder's and the helpers' code, to match a copy without git to its commit."""
    digest = hashlib.sha256()
    for path in sorted([*(REPO / "bench").glob("*.py"), *(REPO / "coursekit").glob("*.py")]):
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def driver_version() -> str | None:
    smi = _command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").splitlines()
    if smi:
        return smi[0]
    try:  # no nvidia-smi on the PATH: the kernel module says it too
        found = re.search(r"Kernel Module\s+([\d.]+)", Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def _device_facts(rank, world_size):
    """Asked inside a forked rank: the recorder's own process must not create a CUDA context."""
    if not torch.cuda.is_available():
        return {"device": f"CPU {platform.machine()}, {os.cpu_count()} cores", "cuda": None, "nccl": None}
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    major, minor = torch.cuda.get_device_capability(0)
    nccl = torch.cuda.nccl.version()  # a tuple (2, 27, 3) in recent torch, an int 22703 in old ones
    return {"device": names[0], "gpus": names, "capability": f"{major}.{minor}", "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
            "memory GiB": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}


def provenance(plan: Plan, visible: int, argv: list[str]) -> dict:
    try:
        facts = launch(_device_facts, 1, backend="gloo", timeout=min(120.0, max(5.0, plan.deadline - time.monotonic())))[0]
    except Exception as exc:  # the sections still run; each says what failed
        facts = {"device": f"unknown (asking the device failed: {_why(exc)})", "cuda": torch.version.cuda, "nccl": None}
    label = f"{facts['device']} ×{plan.ranks}"
    if plan.dry_run:
        label = f"DRY RUN on CPU ({plan.ranks} gloo ranks, tiny sizes): NOT GPU evidence"
    pin, warnings = pinned_torch(), []
    if pin and torch.__version__.split("+")[0] != pin:
        warnings.append(f"recorded with torch {torch.__version__}; the course pins {pin}")
    return {**facts, "label": label, "visible GPUs": visible, "ranks": plan.ranks,
            "driver": driver_version(), "torch": torch.__version__, "python": platform.python_version(),
            "commit": commit(), "sources sha256": sources_sha256(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
            "command": "python3 -m bench.gpu_evidence " + " ".join(argv), "dry_run": plan.dry_run,
            "warnings": warnings}


def _entry(prov: dict, **fields) -> dict:
    entry = {"device": prov["label"], "torch": prov["torch"], "date": prov["date"], "cuda": prov.get("cuda"),
             "driver": prov.get("driver"), **fields}
    if prov["warnings"]:
        entry["warning"] = "; ".join(prov["warnings"])
    return entry


def _why(exc: BaseException) -> str:
    """One line for the results file (the log has the whole traceback)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    total_deadline = time.monotonic() + args.total_timeout - FINISH_S
    if not args.dry_run and not torch.cuda.is_available():
        print(f"No CUDA GPU is visible (torch {torch.__version__}, built for CUDA {torch.version.cuda}). GPU "
              "evidence can only be recorded on a CUDA machine; nothing was recorded.\nTo check that this "
              "command works here, add --dry-run.", flush=True)
        return 2
    visible = torch.cuda.device_count()  # NVML's count: no CUDA context here
    ranks = args.ranks or (2 if args.dry_run else visible)
    if ranks < 1 or (not args.dry_run and ranks > visible):
        print(f"--ranks must be between 1 and the {visible} visible GPU(s)", flush=True)
        return 2
    out = args.out.resolve()
    plan = Plan(dry_run=args.dry_run, ranks=ranks, deadline=total_deadline)
    prov = provenance(plan, visible, argv)
    print(f"Recording on {prov['label']} · torch {prov['torch']} · CUDA {prov.get('cuda')} · "
          f"driver {prov.get('driver')} · commit {prov['commit']} → {out}", flush=True)
    for warning in prov["warnings"]:
        print(f"WARNING: {warning}", flush=True)
    try:  # sections recorded earlier into this folder and not re-run are kept
        results = json.loads((out / "gpu_evidence.json").read_text())
    except (OSError, ValueError):
        results = None
    results = results if isinstance(results, dict) else {}
    results["provenance"] = prov
    failed, not_run = {}, []
    for name in args.only or list(SECTIONS):
        title, needs, module = SECTIONS[name]
        started = time.monotonic()
        if ranks < needs:
            results[name] = _entry(prov, **{"needs GPUs": needs, "gpus": ranks, "rows": [],
                                            "notes": f"needs ≥ {needs} GPUs; not recorded ({ranks} available)"})
            print(f"[{name}] needs ≥ {needs} GPUs; not recorded", flush=True)
            write(results, out)
            continue
        if total_deadline - started < 5:
            not_run.append(name)
            print(f"[{name}] not run: the total time bound is reached", flush=True)
            continue
        deadline = min(started + args.timeout, total_deadline)
        print(f"[{name}] {title} … (at most {deadline - started:.0f} s)", flush=True)
        try:
            entry = getattr(importlib.import_module(f"bench.{module}"), name)(replace(plan, deadline=deadline))
        except Exception as exc:  # one failing section must not cost the others their GPU time
            failed[name] = f"after {time.monotonic() - started:.0f} s: {_why(exc)}"
            print(f"[{name}] FAILED {failed[name]}\n{traceback.format_exc()}", flush=True)
            prov["failed"] = failed
            write(results, out)
            continue
        results[name] = _entry(prov, rows=entry["rows"], setup=entry["setup"], notes=entry["notes"])
        write(results, out)
        print(f"[{name}] {len(entry['rows'])} rows in {time.monotonic() - started:.1f} s", flush=True)
    if not_run:
        prov["not run (out of time)"] = not_run
    if failed:
        prov["failed"] = failed
    write(results, out)
    print(f"wrote {out / 'gpu_evidence.json'} and {out / 'gpu_evidence.md'}", flush=True)
    if failed or not_run:
        print(f"sections that failed: {', '.join(failed) or 'none'}; not run: {', '.join(not_run) or 'none'}",
              flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
