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

One blind spot remains: a tensor whose last reference a gloo worker thread drops (the buffers of a collective)
is freed on a thread the profiler does not record, so its bytes stay counted until the address is reused.
``live_tensor_bytes`` avoids that for memory over time: it keeps a weak reference to the storage of every
tensor an operation returns and adds up the storages still alive after each operation, whichever thread
frees them (gloo's own internal copies, which no operation returns, are not counted).
"""
import contextlib
import os
import time
import weakref

import torch
import torch.utils._pytree as pytree
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


class LiveBytes:
    """What ``live_tensor_bytes`` records: ``timeline`` [(time in ns, bytes alive)], ``marks`` [(time in ns, label)]."""

    def __init__(self):
        self.timeline: list[tuple[int, int]] = []
        self.marks: list[tuple[int, str]] = []

    def mark(self, label: str) -> None:
        self.marks.append((time.perf_counter_ns(), label))

    def at(self, t_ns: int) -> int:
        """Bytes alive at time ``t_ns`` (after the last operation before it)."""
        before = [b for t, b in self.timeline if t <= t_ns]
        return before[-1] if before else 0

    def between(self, start_ns: int, end_ns: int) -> list[tuple[float, int]]:
        """(ms since ``start_ns``, bytes) for every operation in [start, end], starting with the bytes at ``start``."""
        return [(0.0, self.at(start_ns))] + [((t - start_ns) / 1e6, b) for t, b in self.timeline
                                             if start_ns <= t <= end_ns]


@contextlib.contextmanager
def live_tensor_bytes(device: torch.device | str = "cpu"):
    """Record the bytes of every tensor storage on ``device`` alive after each operation run inside the block.

    Counts what operations in the block return (with their views, and the local tensors of a DTensor), until the
    storage is freed or resized, on any thread. Tensors made before the block are not counted: start it before
    building the model. The one place the course uses torch's private dispatch-mode API.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    device_type = torch.device(device).type
    record = LiveBytes()
    storages: dict[int, weakref.ref] = {}

    def track(t):
        if not isinstance(t, torch.Tensor):
            return
        if type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):  # a wrapper subclass: its inner tensors
            for name in t.__tensor_flatten__()[0]:
                track(getattr(t, name))
            return
        if t.device.type != device_type:
            return
        storage = t.untyped_storage()  # torch keeps one Python object per live storage: a weak reference works
        known = storages.get(id(storage))
        if known is None or known() is not storage:
            storages[id(storage)] = weakref.ref(storage)

    def alive() -> int:
        total = 0
        for key, ref in list(storages.items()):
            storage = ref()
            if storage is None:
                storages.pop(key, None)
            else:
                total += storage.nbytes()  # 0 once resized away, as FSDP does with gathered parameters
        return total

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in pytree.tree_leaves(out):
                track(t)
            record.timeline.append((time.perf_counter_ns(), alive()))
            return out

    with Watch():
        yield record


def mib(n_bytes: float) -> float:
    return n_bytes / 2**20
