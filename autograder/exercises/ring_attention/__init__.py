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

Method ("ring, not gather"), measured outside the ranks. The ranks' own record (sends only to r+1, receives only
from r−1, (N−1)·(|K|+|V|) values sent, no collective) lives in the student's process: it shapes the feedback, and the
method check earns its points only when the ranks' peak memory agrees. Bytes cannot tell the two apart (an
all-gather of K and V sends what the ring sends); peak memory can: a gather holds all N chunks of K and V, a ring
two (the one it computes with and the one arriving). The ``memory`` scenario: 4 ranks, one head of 64 positions per
rank and d = 16384, not causal, the same shape for every salt; a chunk of K and V is 8 MiB, the 64 × 64 scores 16
KiB, so chunks dominate. The rank hands its only copies of q, k, v to the student's function (no clones), and
records the first 4 columns of its output (the evidence). Three readings, all outside the rank (meter.py):

* its peak (RssAnon + RssShmem above the fork, sampled every 2 ms): at most the reference ranks' highest plus 1.5
  chunks of K and V. Sampled peaks can miss a short top, and count freed pages that the launching process's heap
  lent the rank (glibc reuses the parent's free chunks whatever the mmap threshold; each observe() therefore fixes
  the launcher's threshold too, but a student's kernel may already hold such chunks: up to one chunk measured);
* what it holds at each send: the grader's hook on ``ProcessGroup.send`` hands the rank's free heap pages back
  (malloc_trim) and stops it at a gate (``SampleAtGates``), so the reading is exact; every rank must send at least
  N−1 times, each time holding at most 2 chunks more than the reference's ranks at theirs.
* through the ring's last hop, read at the launcher's own moments (``observe.HopFloors``: every tick, placed by the
  bytes on the ranks' loopback; no rank asks for them): the least each rank held then, at most what a ring holds
  there by its own arithmetic (the grader's q, k, v, the chunk it computes with, the one arriving, its output: 4
  chunks) plus 0.75; and the loopback's bytes are a ring's (every rank's K and V to every other rank) within 5 %.
  A rank that asks its gates at the sends early escapes the readings above, not this one.

Keeping every partial output is as costly as a gather (an output of (c, d) is as large as a V chunk), so the
exercise asks for a running merge and says so. What each style measured, and what the scenario costs:
``docs/method-evidence.md``.
"""
from ..exercise import Check, Exercise
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
        Check("K and V travel the ring: N−1 point-to-point hops to rank r+1, no collective, two chunks held (memory "
              "measured outside your ranks)", 2, checks.check_ring_traffic, evidence=checks.METHOD_SCENARIOS),
    ],
)
