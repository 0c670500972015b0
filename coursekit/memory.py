"""Peak memory of a piece of code, measured the accurate way on each device.

On CUDA the caching allocator keeps exact counters. On CPU, RSS and tracemalloc do not see torch's
allocator, but the profiler with ``profile_memory=True`` records every allocation and free: replaying
them in time order (``coursekit.memory_replay``) gives the allocated bytes at every moment.
"""
import torch

from .memory_replay import memory_timeline, profile_memory


def peak_memory_bytes(fn, device: torch.device | str = "cpu") -> int:
    """Bytes allocated at the peak while ``fn()`` runs, above what was allocated before."""
    return profile_memory(fn, device)[0]


def peak_from_profile(prof) -> int:
    """The peak of a finished CPU profile (recorded with ``profile_memory=True``)."""
    return max((b for _, b in memory_timeline(prof)), default=0)


def mib(n_bytes: float) -> float:
    return n_bytes / 2**20
