"""Lesson 7 exercise: ``FlashAttention``, a ``torch.autograd.Function`` (FlashAttention-2's algorithm, in torch).

``FlashAttention.apply(q, k, v, is_causal=False) -> o``: q (..., n_q, d), k and v (..., n_k, d), float32 or
bfloat16; o = softmax(q kᵀ / √d) v in q's dtype (``is_causal``: query i sees keys j ≤ i, n_q == n_k). Forward in
tiles of ``BLOCK_Q`` queries × ``BLOCK_K`` keys (module-level constants of the student's cell) with an online
softmax, arithmetic in float32; ``save_for_backward(q, k, v, o, L)`` with L the log-sum-exp of each query's scaled
scores. Backward recomputes each tile's probabilities from q, k and L and never holds an n_q × n_k matrix.

Values: every scenario draws seeded q, k, v and an upstream gradient, calls ``apply`` and ``backward``, and
records o, dq, dk, dv. The reference observation adds the truth: torch's ``scaled_dot_product_attention`` in
float64 on the same inputs. The checks compare with it, normwise (max |error| / max |truth|): 5e-5 in float32
(correct tiled float32 styles are within 1e-6 of it, 1e-5 with scores near 100, as torch's own float32 SDPA is) and
2e-2 with bfloat16 inputs (bf16's own round-off is 4e-3; correct styles measured at 6e-3). Lengths are not
multiples of the tile except in ``plain``; ``ragged`` has n_q ≠ n_k and one leading dimension.

Method (the ``memory`` scenario: n_q = n_k = 512, d = 16, one head, not causal, float32). There an n × n float32
matrix is 1 MiB and q, k, v, o together 128 KiB, so such a matrix dominates. Recorded in the student's process, and
graded (forgeable by a determined student, like everything in-process; an outside meter should replace them):

* what forward saves for backward (``saved_tensors_hooks``, each storage once): no tensor of n_q × n_k / 2 values
  or more, and a float32 L of shape (..., n_q);
* the largest tensor any operator returns during forward + backward (a dispatch mode, ``coursekit.ops.watch_ops``,
  which sees the backward's operators too, about 10 µs each): under half an n_q × n_k matrix. The profiler's
  memory replay would give the true peak, but costs about 10 s here (70× the run itself), so it is left to the
  outside meter.

Measured on the 2-core CPU (torch 2.13.0+cpu; peak = bytes allocated above the start over forward + backward, from the
profiler's memory events, ``coursekit.memory``; the input tensors exist before and are not counted):

  =========================================================  =========  =================  =================
  n = 512 (n = 1024)                                         saved B    peak / n² fp32     largest / n²
  =========================================================  =========  =================  =================
  reference (recomputes tiles, saves q, k, v, o, L)          133,120    0.13 (0.07)        0.031 (0.016)
  value-correct, saves P for backward (wrong)                1,181,696  3.07 (3.03)        1.0
  value-correct, backward through naive attention (wrong)    133,120    4.10 (4.05)        1.0
  naive attention under autograd (no Function)               1,146,880  3.06 (3.03)        1.0
  torch SDPA (CPU flash kernel), for comparison              133,120    0.63 (0.56)        0.031 (the kernel)
  =========================================================  =========  =================  =================

So an outside meter of peak memory can set its threshold at one n × n float32 matrix above the process's baseline
(8× the reference's peak at n = 512, 3× below every wrong method); measure the baseline with a FlashAttention that
returns at once. n = 1024 widens the gap (0.07 against 3 and more) but the reference's tile loop then takes about
0.5 s and a backward through naive attention about 7 s on this CPU.

The ``memory`` scenario also records whether torch's own SDPA ran (an operator of that name in the dispatch mode's
count: calling it is not an answer to this exercise, and every check then fails and says so), and a fingerprint of
its output (the evidence that it really computed attention there).

Cost of one observation (six scenarios, in the student's process): about 1.2 s on the 2-core CPU, most of it the
memory scenario's 90,000 operators under the dispatch mode.
"""
from ..protocol import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="FlashAttention",
    notebook="07_transformers.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    ranks=True,  # every scenario runs in a process of its own, which the launcher measures
    evidence=checks.memory_is_genuine,
    timeout_s=60,  # about 1.5 s for a correct class; a naive backward at n = 512 costs a few seconds more
    checks=[
        Check("The output equals softmax(q kᵀ/√d) v (float32, lengths a multiple of the tile)", 2, checks.check_output),
        Check("The gradients dq, dk, dv equal attention's (float32)", 2, checks.check_gradients),
        Check("Lengths not multiples of the tile, n_q ≠ n_k, one leading dimension", 1, checks.check_ragged),
        Check("Causal: query i sees keys j ≤ i (output and gradients)", 2, checks.check_causal),
        Check("Scores near 100 do not overflow (output and gradients)", 1, checks.check_large_logits),
        Check("bfloat16 inputs give bfloat16 results within bf16 round-off", 1, checks.check_bf16),
        Check("Saves q, k, v, o and L for backward, nothing of size n_q × n_k", 1, checks.check_saved,
              evidence=("memory",)),
        Check("Forward + backward never hold an n_q × n_k matrix (peak memory, measured outside your process)", 2,
              checks.check_peak_memory, evidence=("memory",)),
    ],
)
