"""Lesson 8 exercise: ``ring_attention(q, k, v, is_causal=False) -> out``, context parallelism by a ring.

Run on every rank of the default process group (N ranks). Rank r holds positions ``[r·n/N, (r+1)·n/N)`` of the
sequence: q, k, v are (..., n/N, d) float32. It returns this rank's rows of softmax(q kᵀ/√d [causal over *global*
positions]) v. K and V travel around the ring (rank r sends to (r+1) mod N, receives from (r−1) mod N) with
point-to-point operations in N−1 steps; the partial results are merged with log-sum-exp. Forward only: the grader
calls it under ``torch.no_grad()``.

The grader really runs it on 2, 3 and 4 forked gloo ranks, causal and not. Each rank draws only *its own* chunk of
q, k and v (a generator seeded by the scenario and the rank), so no rank can compute the answer alone. Each rank
records its output and, for feedback, what it sent: every point-to-point message (peer and size, from the grader's
patch of ``dist.ProcessGroup.send``/``recv``, which every Python p2p API goes through) and every gloo collective
(torch's profiler, ``gloo:<kind>``, whatever API issued it). The reference observation adds the full attention over
the whole sequence (float64, in the grader's process), sliced per rank.

A ring that runs the wrong way is invisible on 2 ranks (both directions are the same ring) and without a causal mask
(the merge is order-free and no position matters): the causal scenarios on 3 and 4 ranks catch it.

Method ("ring, not gather"). Here the method check reads the in-process record (sends only to r+1, receives only
from r−1, (N−1)·(|K|+|V|) values sent, no collective): a student's process can forge it. To be measured outside
the student's process instead (``bench/lesson8_method_evidence.py``: each rank's ``/proc/<pid>/io`` wchar and
``/proc/<pid>/status`` VmHWM, reset through ``/proc/<pid>/clear_refs`` just before the call). Bytes cannot tell the
two apart: an all-gather of K and V sends what the ring sends, (N−1)·|K+V| per rank. Peak memory can: the gather
holds all N chunks of K and V (and the attention's concatenated copy), the ring two (the one it computes with and
the one arriving). Measured (2-core CPU, torch 2.13.0+cpu, gloo, load average 59 from other jobs), causal, N = 4,
(batch, heads) = (1, 2), c = 512 positions per rank, d = 2048 (|K+V| = 16 MiB per rank; the c × c score block,
2 MiB, stays small because d ≫ c):

    reference ring         sent 48.0 MiB per rank   peak RSS above the start  92–108 MiB per rank   (1.4 s)
    all-gather of K and V  sent 48.0 MiB per rank   peak RSS above the start 152 MiB per rank      (2.0 s)

The gap is about (N−2)·|K+V| plus the gather's concatenation (here 44 MiB, 2.8 chunks) and grows with N; a
threshold relative to the reference's own peak in the same batch (e.g. reference + 1·|K+V|) separates them. At the
graded sizes (a few KiB) the signal is lost in the allocator's noise: measure in a scenario of its own at this size.
The grading scenarios cost 0.38–0.41 s per observation (all five, salts 1–3, load average 14).
"""
from ..protocol import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="ring_attention",
    notebook="08_multidim_parallel.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    ranks=True,
    evidence=checks.outputs_are_genuine,
    timeout_s=60,  # five launches; a deadlocking submission spends ranks.LAUNCH_TIMEOUT_S in each
    checks=[
        Check("Right output on 2 ranks (softmax(q kᵀ/√d) v over the whole sequence)", 2, checks.check_two_ranks),
        Check("Right output on 3 ranks: three partial results merged with log-sum-exp", 2, checks.check_three_ranks),
        Check("Right causal output on 2 ranks (mask by global positions)", 2, checks.check_two_ranks_causal),
        Check("Right causal output on 3 and 4 ranks (ring direction r → r+1, chunk offsets)", 2, checks.check_causal_ring),
        Check("K and V travel the ring: N−1 point-to-point hops to rank r+1, no collective", 2, checks.check_ring_traffic,
              evidence=checks.TRAFFIC_SCENARIOS),
    ],
)
