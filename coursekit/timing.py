"""Wall-clock timing that is honest on both devices (CUDA work is asynchronous)."""
import statistics
import time

import torch


def time_call(fn, *, repeat: int = 5, warmup: int = 1, device: torch.device | str = "cpu") -> float:
    """Median seconds per call of ``fn()`` after ``warmup`` untimed calls."""
    device = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
