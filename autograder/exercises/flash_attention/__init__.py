"""Lesson 7 exercise: ``FlashAttention``, a ``torch.autograd.Function`` (FlashAttention-2's algorithm, in torch).

``FlashAttention.apply(q, k, v, is_causal=False) -> o``: q (..., n_q, d), k and v (..., n_k, d), float32 or
bfloat16; o = softmax(q kᵀ / √d) v in q's dtype (``is_causal``: query i sees keys j ≤ i, n_q == n_k). Forward in
tiles of ``BLOCK_Q`` queries × ``BLOCK_K`` keys (module-level constants of the student's cell) with an online
softmax, arithmetic in float32; ``save_for_backward(q, k, v, o, L)`` with L the log-sum-exp of each query's scaled
scores. Backward recomputes each tile's probabilities from q, k and L and never holds an n_q × n_k matrix.

Values: every scenario draws seeded q, k, v and an upstream gradient, calls ``apply`` and ``backward``, and records
o, dq, dk, dv, with ``BLOCK_Q = BLOCK_K = 16`` set in the student's cell (``cases.VALUE_BLOCK``: the lengths then
span several tiles, whatever the cell chose). The reference observation adds the truth: torch's
``scaled_dot_product_attention`` in float64 on the same inputs. The checks compare with it, normwise (max |error| /
max |truth|): 5e-5 in float32 (correct tiled float32 styles are within 1e-6 of it, 1e-5 with scores near 100, as
torch's own float32 SDPA is) and 2e-2 with bfloat16 inputs (bf16's own round-off is 4e-3; correct styles measured at
6e-3). Lengths are not multiples of the tile except in ``plain``; ``ragged`` has n_q ≠ n_k and one leading
dimension.

Method (the ``memory`` scenario, ``cases.MEMORY_N`` and ``MEMORY_D``: n_q = n_k = 2048, d = 32, one head, not
causal, float32, with ``BLOCK_Q = BLOCK_K = 256`` set in the student's cell so that the tile loops stay short). There
an n × n float32 matrix is 16 MiB and q, k, v, o 256 KiB each, so such a matrix dominates. The scenario runs in a
process of its own, and the launcher meters that process's peak memory from outside it: the check passes when the
peak exceeds the reference's by at most half an n × n float32 matrix. Every wrong method that holds such a matrix
(saving P for backward, a backward through naive attention, naive attention under autograd) holds one or more
whole ones. What the student's process records itself (what forward saved, via ``saved_tensors_hooks``, and the
largest tensor any operator returned, via ``coursekit.ops.watch_ops``) names the cause in the feedback, and shows
that L was saved.

The ``memory`` scenario also records whether torch's own SDPA ran (an operator of that name in the dispatch mode's
count: calling it is not an answer to this exercise, and every check then fails and says so), the first rows of o
and dq (for the feedback), and sketches of all of o, dq, dk and dv (``observing.sketch``; the evidence that it really
computed attention there, every row of it).

Cost of one observation: the six scenarios, each in a process of its own (``timeout_s`` below says how long).
"""
from ..exercise import Check, Exercise
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
