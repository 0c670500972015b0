"""Lesson 4 exercise: ``gpipe_schedule(num_stages, num_microbatches)``.

The function returns the GPipe time-step table: a list with one entry per time step, each a
list of ``num_stages`` slots holding ``None`` (the stage idles) or ``("F", j)`` / ``("B", j)``
(the forward / backward of micro-batch ``j``). Every forward and backward takes one step.

``observe`` only calls the function and turns what it returns into plain lists; the checks
parse those lists themselves and test properties (completeness, dependencies, GPipe order,
length, bubble) as well as equality with the reference table.
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="gpipe_schedule",
    notebook="04_model_pipeline_parallel.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    evidence=checks.all_ops_appear,
    timeout_s=30,
    checks=[
        Check("Returns the documented table: time steps of num_stages slots (None, ('F', j) or ('B', j))", 1,
              checks.check_format, evidence=cases.MAIN),
        Check("Runs every forward and every backward exactly once on every stage", 2, checks.check_every_op_once),
        Check("Respects the dependencies between stages and between a forward and its backward", 2,
              checks.check_dependencies, evidence=cases.MAIN),
        Check("Keeps GPipe's order: every stage finishes its forwards before its backwards", 1, checks.check_gpipe_order,
              evidence=cases.MAIN),
        Check("Is as short as possible: 2(m + p - 1) time steps", 1, checks.check_minimal_length, evidence=cases.MAIN),
        Check("Has the bubble (p - 1)/(m + p - 1) of idle stage-steps", 1, checks.check_bubble, evidence=cases.MAIN),
        Check("Matches the reference schedule step by step (including hidden cases)", 2, checks.check_reference),
        Check("Handles the edge cases: one stage, one micro-batch", 1, checks.check_edges),
    ],
)
