"""Wall-clock timing that is honest on both devices (CUDA work is asynchronous)."""
import statistics
import time

import torch


def sync(device: torch.device | str) -> None:
    """CUDA work is asynchronous: wait until the GPU has finished what was queued, before reading a clock."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, *, repeat: int = 5, warmup: int = 1, device: torch.device | str = "cpu", best: bool = False) -> float:
    """Median seconds per call of ``fn()`` after ``warmup`` untimed calls; with ``best``, the fastest call (on a
    shared machine other programs only ever add time, so the minimum is the steadier estimate of the call itself)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return min(times) if best else statistics.median(times)
