"""Memory of a piece of code, measured the accurate way on each device.

On CUDA the caching allocator keeps exact counters. On CPU, RSS and tracemalloc do not see torch's
allocator, but the profiler with ``profile_memory=True`` records every allocation and free. Summing each
op's net "self" memory from ``prof.events()`` (the obvious approach) misses a peak *inside* one op (Adam's
multi-tensor step makes a temporary as large as all its moments, then frees it) and the frees torch
attributes to a collective running on gloo's worker thread (FSDP's all-gather and reduce-scatter buffers),
so sharded training would look as if it leaked.

The raw event tree keeps every allocation and free with its own time and address. Replaying them in time
order gives the allocated bytes at every moment; an address allocated again without a recorded free counts
as freed first.
"""
import os

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # silence the profiler's stderr lines


def _events(prof):
    """Every node of the profile's event tree (allocations and ops), in no particular order."""
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def memory_timeline(prof) -> list[tuple[int, int]]:
    """(time in ns, bytes allocated above the start) after every allocation or free, in time order."""
    allocations = sorted((n.start_time_ns, n.extra_fields.ptr, n.extra_fields.alloc_size)
                         for n in _events(prof) if n.tag == _EventType.Allocation)
    live, current, timeline = {}, 0, []
    for t, ptr, size in allocations:
        if size > 0:
            current += size - live.pop(ptr, 0)  # a block at a live address: its free was not recorded
            live[ptr] = size
        else:
            current -= live.pop(ptr, -size)  # a block from before the profile started: trust the size
        timeline.append((t, current))
    return timeline


def memory_at_ends(prof, prefix: str) -> dict[str, int]:
    """Bytes allocated (above the start) when each ``record_function`` named ``prefix…`` ended."""
    timeline = memory_timeline(prof)
    marks = sorted((n.end_time_ns, n.name) for n in _events(prof)
                   if n.tag == _EventType.TorchOp and n.name.startswith(prefix))
    result, i, current = {}, 0, 0
    for end, name in marks:
        while i < len(timeline) and timeline[i][0] <= end:
            current = timeline[i][1]
            i += 1
        result[name] = current
    return result


def profile_memory(fn, device: torch.device | str = "cpu") -> tuple[int, int]:
    """(peak, end): bytes above the start at the peak while ``fn()`` runs, and when it returns."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, torch.cuda.memory_allocated(device) - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    timeline = memory_timeline(prof)
    return max((b for _, b in timeline), default=0), (timeline[-1][1] if timeline else 0)


def peak_memory_bytes(fn, device: torch.device | str = "cpu") -> int:
    """Bytes allocated at the peak while ``fn()`` runs, above what was allocated before."""
    return profile_memory(fn, device)[0]


def mib(n_bytes: float) -> float:
    return n_bytes / 2**20
