"""Lesson 5 exercise: ``zero_memory_per_rank(num_params, world_size, stage, bytes_per_param=(2, 2, 12))``.

Bytes of model state (weights, gradients, optimizer state) one rank holds under ZeRO stage
0–3, as an exact real number: the ZeRO paper divides exactly (7.5 B parameters on 64 ranks,
stage 1: 4Ψ + 12Ψ/64 = 31.4 GB). A stage outside 0–3 raises ValueError.

``observe`` calls the function on the paper's example and on hidden cases (odd world sizes,
world size 1, other byte layouts, invalid stages) and keeps only numbers and exception names.
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="zero_memory_per_rank",
    notebook="05_fsdp_zero.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    evidence=checks.some_bytes_right,
    timeout_s=30,
    checks=[
        Check("Reproduces the ZeRO paper's example: 120 / 31.4 / 16.6 / 1.88 GB per rank", 2, checks.check_paper,
              evidence=checks.EVIDENCE),
        Check("Returns the bytes as a number", 1, checks.check_number, evidence=checks.EVIDENCE),
        Check("Stage 0 (plain data parallel) divides nothing by the world size", 1, checks.check_stage(0)),
        Check("Stage 1 shards only the optimizer state", 1, checks.check_stage(1)),
        Check("Stage 2 shards gradients and optimizer state, not the weights", 1, checks.check_stage(2)),
        Check("Stage 3 shards weights, gradients and optimizer state", 1, checks.check_stage(3)),
        Check("Divides exactly when the world size does not divide the bytes (odd world sizes)", 1, checks.check_exact),
        Check("Uses bytes_per_param for weights, gradients and optimizer state", 1, checks.check_layout),
        Check("Rejects a stage outside 0-3 with ValueError", 1, checks.check_invalid, evidence=checks.EVIDENCE),
    ],
)
