"""Where one training step's time goes, read from torch.profiler's own events (Lessons 3 and 6, GPU recorder).

A rank's step of wall time T splits into four parts that add up to T exactly:

* **compute only**: the compute stream is busy and no collective is running;
* **overlapped**: compute and a collective run at the same time (communication hidden behind compute);
* **exposed communication**: a collective runs and nothing else does (the step waits for the network);
* **idle**: neither (Python overhead between ops, waiting for a late peer, kernel launch gaps on a GPU).

Which events count as what:

* on a GPU (the profile has CUDA events): the device's own work, as in Holistic Trace Analysis. NCCL kernels
  are communication; every other kernel, copy or memset is compute. The GPU timeline also carries
  *annotations*: each ``record_function`` range (``train_step``, ``nccl:all_reduce``...) drawn over the
  kernels it launched. They span work without being work, so they count as neither.
* on a CPU with gloo: the thread that ran the step is the "compute stream". Its ops are compute, except
  the collective calls themselves (``c10d::…``), during which it is stuck in communication. gloo does the
  actual work on its own threads (``gloo:all_reduce``…): those intervals are communication too.

Time is measured as the length of a union of intervals, so nested ops and two collectives running at once
on two gloo threads are not counted twice.
"""
import os
import statistics

from torch.autograd import DeviceType

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # silence the profiler's stderr lines

PARTS = ("compute only", "overlapped", "exposed comm", "idle")


# NCCL's kernels: ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclDevKernel_SendRecv… (NCCL 2.19 and later),
# ncclDevKernel_Generic / ncclDevKernel_Generic_1 (recent NCCL runs most collectives through these; the name
# does not say which collective), ncclKernel_AllReduce_RING_LL_Sum_float… (NCCL before 2.19).
NCCL_KERNELS = ("ncclDevKernel_", "ncclKernel_")


def is_collective_work(name: str) -> bool:
    """Where a collective's bytes move: gloo's own threads (``gloo:all_reduce``…) or an NCCL kernel on a GPU."""
    return name.startswith("gloo:") or name.startswith(NCCL_KERNELS)


def is_communication(name: str) -> bool:
    """Collective work, or a collective call on the training thread (``c10d::allreduce_``, ``nccl:all_reduce``)."""
    low = name.lower()
    return is_collective_work(name) or low.startswith(("c10d::", "record_param_comms")) or "nccl" in low


def device_work(events) -> list:
    """The GPU's own work in a profile: kernels, copies and memsets, without the GPU-side annotations.

    An annotation is a ``record_function`` range that the profiler also draws on the GPU timeline
    (``is_user_annotation``; torch versions without that flag are recognised by the name, which a CPU
    event of the same profile carries too: kernels are never named like CPU ops).
    """
    events = list(events)
    cpu_names = {e.name for e in events if e.device_type == DeviceType.CPU}
    return [e for e in events if e.device_type == DeviceType.CUDA
            and not getattr(e, "is_user_annotation", False) and e.name not in cpu_names]


# ---- interval arithmetic on sorted lists of (start, end) --------------------------------------------

def union(intervals) -> list[tuple[float, float]]:
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        elif end > start:
            merged.append((start, end))
    return merged


def length(intervals) -> float:
    return sum(end - start for start, end in union(intervals))


def intersection(a, b) -> list[tuple[float, float]]:
    a, b, out, i, j = union(a), union(b), [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a, b) -> list[tuple[float, float]]:
    """The parts of ``a`` not covered by ``b``."""
    out = []
    for start, end in union(a):
        for cut_start, cut_end in union(b):
            if cut_end <= start or cut_start >= end:
                continue
            if cut_start > start:
                out.append((start, cut_start))
            start = max(start, cut_end)
        if start < end:
            out.append((start, end))
    return out


def _clip(intervals, lo, hi):
    return [(max(s, lo), min(e, hi)) for s, e in intervals if s < hi and e > lo]


# ---- the backward pass and the collectives it overlaps (Lesson 3) --------------------------------------

def is_backward_node(name: str) -> bool:
    """An autograd node computing gradients; not AccumulateGrad, inside which DDP waits for its all-reduces."""
    return name.startswith("autograd::engine::evaluate_function") and "AccumulateGrad" not in name


def backward_overlap(events, region: str = "backward") -> dict:
    """The backward pass inside ``record_function(region)`` and the collectives, as intervals in ms from its start.

    On a CPU (gloo): the training thread's autograd nodes are the compute, gloo's threads the communication. On a
    GPU, the CPU only *launches* kernels and runs ahead of the device, so CPU-side times say nothing about overlap:
    the compute is the device's own kernels inside the region's device-side span (the annotation the profiler
    draws on the GPU timeline), the communication NCCL's kernels, as in ``step_intervals``.
    Returns {"compute": [...], "comm": [...], "backward ms": when the last gradient was computed}.
    """
    events = list(events)
    on_device = device_work(events)
    if on_device:
        spans = [(e.time_range.start, e.time_range.end) for e in events if e.name == region
                 and e.device_type == DeviceType.CUDA]
        lo, hi = (min(a for a, _ in spans), max(b for _, b in spans)) if spans else (float("-inf"), float("inf"))
        compute = [(e.time_range.start, e.time_range.end) for e in on_device
                   if not is_collective_work(e.name) and lo <= e.time_range.start < hi]
        comm = [(e.time_range.start, e.time_range.end) for e in on_device if is_collective_work(e.name)]
    else:
        compute = [(e.time_range.start, e.time_range.end) for e in events if is_backward_node(e.name)]
        comm = [(e.time_range.start, e.time_range.end) for e in events if is_collective_work(e.name)]
    if not compute:
        raise ValueError(f"no backward computation found: wrap loss.backward() in record_function({region!r})")
    t0, end = min(a for a, _ in compute), max(b for _, b in compute)
    return {"compute": [((a - t0) / 1e3, (b - t0) / 1e3) for a, b in union(compute)],
            "comm": [((a - t0) / 1e3, (b - t0) / 1e3) for a, b in union(comm) if b > t0],
            "backward ms": (end - t0) / 1e3}


# ---- the breakdown -----------------------------------------------------------------------------------

def step_intervals(prof, step_name: str = "train_step") -> list[dict]:
    """For every ``record_function(step_name)`` range: its window and its compute and communication intervals (µs)."""
    events = list(prof.events())
    on_device = device_work(events)
    steps = sorted((e for e in events if e.name == step_name and e.device_type == DeviceType.CPU),
                   key=lambda e: e.time_range.start)
    found = []
    for step in steps:
        lo, hi = step.time_range.start, step.time_range.end
        if on_device:
            spans = [(e.name, (e.time_range.start, e.time_range.end)) for e in on_device]
            compute = [iv for name, iv in spans if not is_collective_work(name)]
            comm = [iv for name, iv in spans if is_collective_work(name)]
        else:
            mine = [e for e in events if e.thread == step.thread and e is not step and e.device_type == DeviceType.CPU]
            stuck = [(e.time_range.start, e.time_range.end) for e in mine if is_communication(e.name)]
            busy = [(e.time_range.start, e.time_range.end) for e in mine if not is_communication(e.name)]
            compute = subtract(busy, stuck)
            comm = stuck + [(e.time_range.start, e.time_range.end) for e in events
                            if e.thread != step.thread and is_communication(e.name)]
        found.append({"window": (lo, hi), "compute": union(_clip(compute, lo, hi)),
                      "comm": union(_clip(comm, lo, hi))})
    return found


def step_breakdown(prof, step_name: str = "train_step") -> list[dict]:
    """One dict per profiled step: wall time and the four parts (ms); the parts add up to the wall time."""
    rows = []
    for step in step_intervals(prof, step_name):
        (lo, hi), compute, comm = step["window"], step["compute"], step["comm"]
        both = length(intersection(compute, comm))
        busy = length(compute + comm)
        rows.append({"step ms": (hi - lo) / 1e3,
                     "compute only": (length(compute) - both) / 1e3,
                     "overlapped": both / 1e3,
                     "exposed comm": (length(comm) - both) / 1e3,
                     "idle": (hi - lo - busy) / 1e3})
    return rows


def median_breakdown(rows: list[dict]) -> dict:
    """Median over steps of each part, rescaled so that the parts still add up to the median step time."""
    if not rows:
        raise ValueError("no profiled steps: wrap each step in record_function('train_step')")
    step = statistics.median(r["step ms"] for r in rows)
    parts = {p: statistics.median(r[p] for r in rows) for p in PARTS}
    scale = step / (sum(parts.values()) or 1.0)
    return {"step ms": step, **{p: v * scale for p, v in parts.items()}}


def shares(breakdown: dict) -> dict:
    """The four parts as fractions of the step, plus the communication share and the hidden fraction."""
    total = breakdown["step ms"] or 1.0
    comm = breakdown["overlapped"] + breakdown["exposed comm"]
    out = {p: breakdown[p] / total for p in PARTS}
    out["comm share"] = comm / total
    out["hidden"] = breakdown["overlapped"] / comm if comm else 0.0
    return out


def ops_table(prof, rows: int = 12, on_device: bool = False) -> str:
    """The profiler's own table of the heaviest ops, narrow enough for a notebook."""
    sort_by = "self_device_time_total" if on_device else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=42)
