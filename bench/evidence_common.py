"""What every GPU-evidence section shares: the plan of a run (GPU or CPU dry run, ranks, deadline).

Every measurement runs in ranks forked by ``coursekit.dist.launch`` (NCCL on GPUs, gloo in a dry run), even
the single-GPU ones: a forked rank cannot use a CUDA context its parent created, so the recorder's own
process never touches the GPU. One sweep never mixes backends or devices: every launch of a plan uses the
plan's backend.
"""
import time
from dataclasses import dataclass

from coursekit.dist import launch


class OutOfTime(RuntimeError):
    """The section's deadline passed before it could start its next launch."""


@dataclass(frozen=True)
class Plan:
    dry_run: bool   # True: tiny sizes, CPU ranks with gloo; the numbers prove the code runs, nothing else
    ranks: int      # GPUs to use (in a dry run: CPU processes standing in for them)
    deadline: float = float("inf")  # time.monotonic() by which the section must be done

    @property
    def backend(self) -> str:
        return "gloo" if self.dry_run else "nccl"

    def size(self, gpu, dry):
        """The GPU-sized value, or the tiny one in a dry run."""
        return dry if self.dry_run else gpu

    def world_sizes(self, smallest: int = 1) -> list[int]:
        """1, 2, 4, 8… up to the number of ranks, and that number itself (e.g. 1, 2, 4, 6 on six GPUs)."""
        return sorted(n for n in {1, 2, 4, 8, 16, self.ranks} if smallest <= n <= self.ranks)

    def run(self, fn, world_size: int, *args) -> list:
        """``fn`` on ``world_size`` ranks of this plan's backend, stopped at the section's deadline."""
        left = self.deadline - time.monotonic()
        if left < 1:
            raise OutOfTime("the section's time ran out before its next launch")
        return launch(fn, world_size, *args, backend=self.backend, timeout=left)


def mib(n_bytes: float) -> float:
    return n_bytes / 2**20
