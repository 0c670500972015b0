"""What an outside meter sees of Lesson 8's two rank exercises: "ring, not gather" and "all-to-all, not gather".

The grader's method evidence is to be measured outside the student's process (the issue on unfakeable rank
grading): per rank, the peak memory of the process and the bytes it wrote to its sockets. This script measures both
for the reference solutions (from ``solutions/``) and for a value-correct submission that uses the forbidden
collective instead, at problem sizes where the method's signal dominates, so that thresholds can be set:

* ``ring_attention`` on 4 ranks, (batch, heads) = (1, 2), chunk c = 512 positions per rank, d = 2048: one rank's K
  and V are 16 MiB together. The ring holds the K/V it computes with and the one arriving; an all-gather holds all
  N of them (and, for the attention, a concatenated copy). Bytes: the same for both (each rank sends its K/V to N−1
  others), so only memory tells them apart.
* ``ExpertParallelMoE`` on 4 ranks, 8 experts, t = 4096 tokens of d = 256 per rank (4 MiB), forward and backward:
  all-to-alls send each token once each way; a gather sends every rank's tokens to every rank and sums the outputs
  back with an all-reduce.

Each rank reads, around the call (after a barrier, so that set-up traffic is not counted):
``/proc/self/io`` ``wchar`` (bytes passed to write/send system calls: gloo's TCP sends on loopback) and
``/proc/self/status`` ``VmHWM`` after resetting it (``/proc/self/clear_refs`` ← 5) to the current ``VmRSS``. Both are
readable from the parent (``/proc/<pid>/io``, ``/proc/<pid>/status``) by the same uid, which is how an outside meter
would read them while the rank waits at a barrier after the call.

Run: ``python -m bench.lesson8_method_evidence`` (about a minute on the 2-core CPU). Results of a run are in the
exercise modules' docstrings (autograder/exercises/ring_attention.py, expert_parallel_moe.py).
"""
import os
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn

from autograder.authoring.course import reference_function
from autograder.exercises.beside.define import define_function
from coursekit.dist import launch

MIB = 2**20
SETUP = "import math\nimport torch\nimport torch.distributed as dist\nfrom torch import nn\n"

RING_ALL_GATHER = '''
import torch.nn.functional as F


def ring_attention(q, k, v, is_causal=False):
    n, r = dist.get_world_size(), dist.get_rank()
    ks, vs = [torch.empty_like(k) for _ in range(n)], [torch.empty_like(v) for _ in range(n)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    c = q.shape[-2]
    mask = (torch.arange(n * c)[None, :] <= (r * c + torch.arange(c))[:, None]) if is_causal else None
    return F.scaled_dot_product_attention(q, torch.cat(ks, -2), torch.cat(vs, -2), attn_mask=mask)
'''

MOE_ALL_GATHER = '''
import torch.distributed.nn.functional as dist_nn


class ExpertParallelMoE(nn.Module):
    def __init__(self, router, experts):
        super().__init__()
        n, r = dist.get_world_size(), dist.get_rank()
        self.per = len(experts) // n
        self.first = r * self.per
        self.router = router
        self.mine = experts[self.first:self.first + self.per]

    def forward(self, x):
        n, r = dist.get_world_size(), dist.get_rank()
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(n)]
        dist.all_gather(sizes, torch.tensor([len(x)]))
        sizes = [int(s) for s in sizes]
        padded = torch.cat([x, x.new_zeros((max(sizes) - len(x), x.shape[1]))])
        everyone = torch.cat([part[:size] for part, size in zip(dist_nn.all_gather(padded), sizes)])
        expert = self.router(everyone).softmax(-1).argmax(-1)
        out = torch.zeros_like(everyone)
        for j, module in enumerate(self.mine):
            hit = expert == self.first + j
            out = out.masked_scatter(hit[:, None], module(everyone[hit]))
        out = dist_nn.all_reduce(out)
        start = sum(sizes[:r])
        mine = slice(start, start + len(x))
        return self.router(x).softmax(-1).gather(-1, expert[mine][:, None]) * out[mine]
'''


def _io_wchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar"))


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def metered(call) -> dict:
    """Bytes written to sockets and peak RSS above the start while ``call()`` runs on this rank."""
    dist.barrier()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    rss, wchar = _status("VmRSS"), _io_wchar()
    started = time.perf_counter()
    call()
    seconds = time.perf_counter() - started
    peak, sent = _status("VmHWM") - rss, _io_wchar() - wchar
    dist.barrier()
    return {"sent": sent, "peak": peak, "seconds": seconds}


def ring_rank(rank, world_size, fn, lead, chunk, d):
    torch.manual_seed(rank)
    q, k, v = (torch.randn(*lead, chunk, d) for _ in range(3))
    with torch.no_grad():
        return metered(lambda: fn(q, k, v, is_causal=True))


def moe_rank(rank, world_size, cls, experts_n, tokens, d):
    torch.manual_seed(0)
    router = nn.Linear(d, experts_n)
    experts = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, d)) for _ in range(experts_n))
    torch.manual_seed(100 + rank)
    x = torch.randn(tokens, d, requires_grad=True)
    module = cls(router, experts)

    def step():
        module(x).square().sum().backward()

    return metered(step)


def report(label: str, ranks: list[dict]) -> None:
    sent = [r["sent"] / MIB for r in ranks]
    peak = [r["peak"] / MIB for r in ranks]
    print(f"  {label:<34} sent/rank MiB {min(sent):7.1f}–{max(sent):7.1f}   peak RSS/rank MiB {min(peak):7.1f}–"
          f"{max(peak):7.1f}   ({max(r['seconds'] for r in ranks):.2f} s)")


def main() -> None:
    warnings.simplefilter("ignore")  # torch.distributed.nn.functional's deprecation notices, once per rank
    print(f"load average {os.getloadavg()[0]:.2f}; torch {torch.__version__}")
    ring = {"reference ring": reference_function("ring_attention"),
            "all-gather of K and V": define_function([("setup", SETUP), ("variant", RING_ALL_GATHER)],
                                                     "ring_attention")}
    lead, chunk, d, n = (1, 2), 512, 2048, 4
    kv = 2 * 4 * chunk * d * 2
    print(f"ring_attention, N = {n}, (b, heads) = {lead}, c = {chunk}, d = {d}: K+V of one rank {kv / MIB:.0f} MiB")
    for label, fn in ring.items():
        report(label, launch(ring_rank, n, fn, lead, chunk, d, backend="gloo", timeout=300))
    moe = {"reference all-to-all": reference_function("ExpertParallelMoE"),
           "all-gather + all-reduce of tokens": define_function([("setup", SETUP), ("variant", MOE_ALL_GATHER)],
                                                                "ExpertParallelMoE")}
    for n, experts_n, tokens, d in ((2, 4, 4096, 256), (4, 8, 4096, 256)):
        print(f"ExpertParallelMoE, N = {n}, E = {experts_n}, t = {tokens}, d = {d}: tokens of one rank "
              f"{tokens * d * 4 / MIB:.0f} MiB (forward + backward)")
        for label, cls in moe.items():
            report(label, launch(moe_rank, n, cls, experts_n, tokens, d, backend="gloo", timeout=300))


if __name__ == "__main__":
    main()
