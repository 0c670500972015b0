"""Lesson 10 exercise: ``FusedLayerNorm``, LayerNorm forward and backward as two Triton kernels and an autograd
Function.

The interface (the lesson states it): ``layer_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
n_cols, eps, BLOCK)`` and ``layer_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr,
n_cols, BLOCK)``, each launched on one program per row of a contiguous (rows, n_cols) tensor and walking its row in
chunks of any power-of-two BLOCK; mean and rstd are float32, and the backward stores each row's share of dw and db
(dy·x̂ and dy) in float32 (rows, n_cols) buffers. ``FusedLayerNorm.apply(x, w, b) -> y`` normalises the last
dimension of x (..., n) and sums the shares.

The grader launches the kernels itself (observe.py): its own grid and BLOCK, rows not a multiple of BLOCK, every
buffer inside a larger one whose edges hold NaN (inputs: a read past the end shows in the values) or a sentinel
(outputs: a write past the end shows), float32 and bfloat16 rows (mean near 8, where a bfloat16 sum is visibly
wrong). The backward kernel gets the true statistics, so its check does not depend on the forward's. Only the
``function`` scenario goes through the student's own wrapper: its grid, block and dw/db sums. Values are compared
with LayerNorm in float64, normwise: 1e-5 in float32 (correct kernels: ~4e-7), 2e-2 for bfloat16 results (~8e-3).

Cost of one observation: five scenarios, each in a process of its own: about 1.9 CPU-seconds in those processes
(2-core CPU, 2026-12-06, measured at a load average of 53), after the worker's own imports of torch and Triton.
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="FusedLayerNorm",
    notebook="10_triton_kernels.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    ranks=True,  # every scenario in a process of its own: a write past a buffer costs only its scenario
    evidence=checks.kernels_ran,
    timeout_s=60,
    checks=[
        Check("Forward kernel: mean, rstd and y of every row (float32, rows longer than BLOCK)", 2,
              checks.check_forward),
        Check("Backward kernel: dx and each row's shares of dw and db (float32)", 2, checks.check_backward),
        Check("Masks: rows shorter than BLOCK, nothing read or written outside a row", 2, checks.check_masks,
              evidence=("forward", "backward")),
        Check("bfloat16 rows: statistics in float32, y and dx within bf16 round-off", 2, checks.check_bf16),
        Check("The autograd Function: y, dx, dw and db of every row of a (…, n) input", 2, checks.check_function),
    ],
)
