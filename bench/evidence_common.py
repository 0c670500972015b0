"""What every GPU-evidence section shares: the plan of a run (GPU or CPU dry run) and small rank helpers.

Every measurement runs in ranks forked by ``coursekit.dist.launch`` (NCCL on GPUs, gloo in a dry run), even
the single-GPU ones: a forked rank cannot use a CUDA context its parent created, so the recorder's own
process never touches the GPU.
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist

from coursekit.dist import launch, rank_device


@dataclass(frozen=True)
class Plan:
    dry_run: bool   # True: tiny sizes, CPU ranks with gloo; the numbers prove the code runs, nothing else
    ranks: int      # GPUs to use (in a dry run: CPU processes standing in for them)
    timeout: float = 600.0

    @property
    def backend(self) -> str:
        return "gloo" if self.dry_run else "nccl"

    def size(self, gpu, dry):
        """The GPU-sized value, or the tiny one in a dry run."""
        return dry if self.dry_run else gpu

    def world_sizes(self) -> list[int]:
        """1, 2, 4, 8… up to the number of ranks, and that number itself (e.g. 1, 2, 4, 6 on six GPUs)."""
        return sorted({n for n in (1, 2, 4, 8, 16) if n <= self.ranks} | {self.ranks})

    def run(self, fn, world_size: int, *args) -> list:
        return launch(fn, world_size, *args, backend=self.backend, timeout=self.timeout)


def my_device() -> torch.device:
    """Inside a rank: its GPU under NCCL, the CPU under gloo."""
    return rank_device(dist.get_backend(), dist.get_rank())


def barrier(device: torch.device) -> None:
    """All ranks meet; NCCL is told which GPU to use (else it guesses and warns)."""
    dist.barrier(device_ids=[device.index]) if device.type == "cuda" else dist.barrier()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def mib(n_bytes: float) -> float:
    return n_bytes / 2**20
