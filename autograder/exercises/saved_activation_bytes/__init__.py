"""Lesson 7 exercise: ``saved_activation_bytes(module, *inputs) -> int``.

Runs ``module(*inputs)`` with autograd on and returns the bytes autograd keeps for backward: every tensor saved
during that forward as ``torch.autograd.graph.saved_tensors_hooks`` sees it, counted once per distinct storage by
the storage's size (``t.untyped_storage().nbytes()``), the module's own parameters and buffers left out, everything
else (the inputs included) counted.

Observed on seeded layers (each on held-out sizes for a non-zero salt; the bytes depend on the sizes only): an
``nn.Linear`` (what it saves is its input, and its weight, which is a parameter); a small module that multiplies
by a buffer (a buffer saved for backward, left out); a GELU applied to a slice of a larger tensor (a view: its
whole storage counts); ``coursekit.transformer.Block`` in float32 with SDPA (q, k and v are views of one storage);
and the same block in bfloat16 with naive attention and dropout in training mode (Korthikanti et al.'s
34sbh + 5as²b, plus LayerNorm's statistics and the causal mask). The checks compare exact integers with the
reference's count. The numbers are the evidence: only counting the seeded layers' saved tensors gives them.

Cost of one observation: about 0.1 s on the 2-core CPU.
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="saved_activation_bytes",
    notebook="07_transformers.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    evidence=checks.counted_right,
    timeout_s=30,
    checks=[
        Check("Counts what nn.Linear saves, its input included", 2, checks.check_linear),
        Check("Leaves the module's parameters and buffers out", 2, checks.check_buffer),
        Check("Counts a view by its whole storage", 2, checks.check_slice),
        Check("Counts each storage once (a transformer block: q, k, v are views of one tensor)", 2,
              checks.check_block_sdpa),
        Check("A bfloat16 block with naive attention and dropout, to the byte", 2, checks.check_block_bf16),
        Check("Returns a Python int", 1, checks.check_returns_int, evidence=("linear",)),
    ],
)
