"""Peak memory of a piece of code, measured the accurate way on each device.

On CUDA the caching allocator keeps exact counters. On CPU, RSS and tracemalloc do not
see torch's allocator, but the profiler with ``profile_memory=True`` records every
allocation and free: replaying them in time order gives the peak.
"""
import os

import torch
from torch.profiler import ProfilerActivity, profile

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # silence the profiler's stderr lines


def peak_memory_bytes(fn, device: torch.device | str = "cpu") -> int:
    """Bytes allocated at the peak while ``fn()`` runs, above what was allocated before."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return peak_from_profile(prof)


def peak_from_profile(prof) -> int:
    """Replay a CPU profile's allocations and frees in time order and return the peak."""
    # Each allocation is charged to the innermost op that made it ("self" memory);
    # frees outside any op appear as "[memory]" events with a negative size.
    changes = [(e.time_range.start, e.self_cpu_memory_usage)
               for e in prof.events() if e.self_cpu_memory_usage]
    changes.sort()
    current = peak = 0
    for _, delta in changes:
        current += delta
        peak = max(peak, current)
    return peak


def mib(n_bytes: float) -> float:
    return n_bytes / 2**20
