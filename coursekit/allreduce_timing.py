"""Lesson 3's all-reduce timing, shared with the GPU evidence recorder.

Every rank all-reduces a buffer of each size ``repeats`` times and keeps the fastest: noise (another process
taking the core, a late partner) only ever adds time, so the minimum is the best estimate of the operation
itself. Each call starts from a barrier, so we time the collective, not a partner that arrived late.
"""
import time

import torch
import torch.distributed as dist

from .dist import barrier, my_device
from .timing import sync


def allreduce_seconds(rank, world_size, sizes, repeats=15):
    """Fastest time of one all-reduce of ``n`` float32 elements, for each ``n`` in ``sizes`` (this rank's view)."""
    dev = my_device()
    fastest = []
    for n in sizes:
        buffer = torch.ones(n, device=dev)
        dist.all_reduce(buffer)  # warm-up: first use of this size allocates buffers
        samples = []
        for _ in range(repeats):
            barrier(dev)  # start together, so we time the collective and not a late partner
            sync(dev)
            start = time.perf_counter()
            dist.all_reduce(buffer)
            sync(dev)
            samples.append(time.perf_counter() - start)
        fastest.append(min(samples))
    return fastest


def bus_bandwidth(n_bytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth (bytes/s): what each rank's links carry in a ring all-reduce, 2(N-1)/N · n / T.

    Undefined for one rank, which moves no data: a "bandwidth" of one rank would only measure a fixed cost.
    """
    if world_size < 2:
        raise ValueError("an all-reduce over one rank moves no data: it has no bandwidth")
    return 2 * (world_size - 1) / world_size * n_bytes / seconds
