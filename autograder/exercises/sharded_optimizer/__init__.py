"""Lesson 5 exercise: ``ShardedOptimizer``, ZeRO stage 1 written by the student.

``ShardedOptimizer(params, optimizer_cls, **kwargs)`` is a ``torch.optim.Optimizer`` that, on every rank of an
initialised process group, keeps ``optimizer_cls``'s state only for this rank's share of the parameters, steps
only that share, and then shares the updated parameters, so that after ``step()`` every rank holds the same
parameters as one process running ``optimizer_cls`` on all of them. ``add_param_group`` works as for any
optimizer (the hyperparameters of every group are kept).

The grader really runs it: 2 or 3 forked local ranks (gloo, ``ranks.run_on_ranks``) build the same seeded
model and give every rank the same gradient (the full batch on every rank, as DDP's all-reduce would leave it),
then step the student's optimizer a few times. Each rank records its parameters after every step and the bytes of
optimizer state its optimizer holds: the tensors (``dim > 0``) in the ``state`` of every ``torch.optim.Optimizer``
reachable from the student's object, itself included. The reference observation adds, on rank 0, the same
training with the unsharded ``optimizer_cls`` (on the same gradients, in the same process): the ground truth.

Method ("sharded"), measured outside the ranks. Whatever the object shows (its ``state``) is the student's to shape:
issue 25's "no sharding at all" steps a full optimizer kept out of the walk's reach and shows a local optimizer
holding this rank's share of its state (11/11 before). So the state check earns its points only when the memory
agrees: the ``memory`` scenario runs AdamW on 4 ranks over 8 tensors of 512 × 512 float32 (8 MiB of parameters,
the same on every rank; new seeded gradients written in place before each of 2 steps), and after each step every
rank hands its free heap pages back (malloc_trim: pages the launching process's heap lent it would count as held,
+16 MiB for the flat style once in a test session) and stops at a gate of the grader's loop where the launcher reads
what it holds (``SampleAtGates``: RssAnon + RssShmem above the fork, meter.py). The gate's answer, a seed the
launcher draws after the fork (one for every rank), is mixed into the next step's gradients, and the rank reports its
parameters projected on the step's gradients: the second reading exists only once the first was answered, a rank
asking more or fewer times than once a step loses the check, and the launcher recomputes the digests and the
parameters after both steps with the plain AdamW (the truth, which every rank must hold, so that no rank saves
memory by skipping work; docs/grading.md, gates between steps). Between steps a sharded rank keeps 2·P/N of AdamW
state, an unsharded one 2·P. The reference observation measures, in the same batch and the same way, the reference
(the threshold's floor) and the plain unsharded AdamW on every rank (its ceiling). A rank passes when it holds at
most the reference's most plus half their difference. Why held between steps
and not the peak: the flat style's all-gather needs full-size temporaries (its peak is above the unsharded one's),
yet it keeps 1/N of the state; the gates read what a rank keeps. Why 4 ranks: a flat style keeps a copy of its shard
and the shard's gradient (2·P/N more than the reference), which at 2 ranks is exactly the unsharded optimizer's
extra. What each style measured, and what the scenario costs: ``docs/method-evidence.md``.

Not allowed: using ``torch.distributed.optim.ZeroRedundancyOptimizer`` (as the class or inside it). The exercise
is to write the sharding; the lesson measures torch's version next to the student's. Such a submission fails
every check with a sentence that says so.
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="ShardedOptimizer",
    notebook="05_fsdp_zero.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    ranks=True,
    evidence=checks.did_real_work,
    timeout_s=60,  # four launches; a deadlocking submission spends LAUNCH_TIMEOUT_S in each
    checks=[
        Check("Matches unsharded AdamW with weight decay after several steps (2 ranks)", 2, checks.check_adamw),
        Check("Matches unsharded SGD with momentum after several steps (3 ranks)", 2, checks.check_sgd),
        Check("Every rank holds the same parameters after every step()", 2, checks.check_same_everywhere,
              evidence=("adamw_two", "sgd_three")),
        Check("Each rank keeps optimizer state for about 1/N of the parameters (2 and 3 ranks; memory measured on 4)", 2,
              checks.check_state_is_sharded, evidence=("adamw_two", "sgd_three", "memory")),
        Check("Keeps every parameter group's hyperparameters, also for groups added with add_param_group", 2,
              checks.check_groups),
        Check("Works when there are fewer parameter tensors than ranks (a rank owns nothing)", 1, checks.check_few_params),
    ],
)
