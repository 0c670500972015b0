"""Lesson 10 exercise: ``TritonFlashAttention``, FlashAttention-2's forward as a Triton kernel and the autograd
Function that uses it, with a backward in PyTorch from the saved log-sum-exp L.

The interface (the lesson states it): ``flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, L_ptr, n, scale, D, BLOCK_M,
BLOCK_N, CAUSAL)`` on the grid (cdiv(n, BLOCK_M), batch·heads) over contiguous (batch·heads, n, D) q, k, v, o and a
float32 (batch·heads, n) L: program (i, b) owns query tile i of batch·head b and walks the key tiles of BLOCK_N
with an online softmax. ``TritonFlashAttention.apply(q, k, v, causal) -> o`` for (batch, heads, n, d) inputs.

The grader launches the kernel itself (observe.py): its own grid and blocks, n not a multiple of either, every
buffer inside a larger one whose edges hold NaN (inputs) or a marker (outputs), float32 and bfloat16. The method is
read from the values of launches the grader arranges, never from the student's process: BLOCK_N smaller than n
(a kernel must walk the key tiles), and in ``causal_tiles`` one causal launch per query tile with every key past
that tile's diagonal key tile NaN, so a kernel that loads a key tile above the diagonal (and only masks its scores)
gets NaN into o; counting tl.load calls would be read inside the student's process, which the student's code can
patch. Values are compared with softmax(q kᵀ·scale) v in float64, normwise: 1e-5 in float32, 2e-2 for bfloat16's o.

Cost of one observation: five scenarios, each in a process of its own: about 1.8 CPU-seconds in those processes
(2-core CPU, 2026-12-06, salts 0, 1 and 2, measured at a load average of 10), after the worker's own imports of
torch and Triton (about 1.5 CPU-seconds).
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="TritonFlashAttention",
    notebook="10_triton_kernels.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    ranks=True,  # every scenario in a process of its own: a write past a buffer costs only its scenario
    evidence=checks.kernel_ran,
    timeout_s=60,
    checks=[
        Check("Non-causal: o and L of every query row (float32, n not a multiple of BLOCK_M or BLOCK_N)", 2,
              checks.check_full),
        Check("Causal: each query attends to the keys up to its own position, the diagonal included", 2,
              checks.check_causal),
        Check("Causal tiles: no key tile after the diagonal is loaded (the grader's NaN there)", 2,
              checks.check_tiles),
        Check("Masks: nothing read or written outside q, k, v, o and L", 2, checks.check_masks,
              evidence=("full",)),
        Check("bfloat16 inputs: L in float32, o within bf16 round-off", 2, checks.check_bf16),
        Check("The autograd Function: o, dq, dk and dv of a causal (batch, heads, n, d) call", 2,
              checks.check_function),
    ],
)
