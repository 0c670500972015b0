"""Lesson 3 exercise: ``average_gradients(model)``, the heart of data parallelism.

Called on every rank of an initialised process group after ``loss.backward()``, it must leave
in every parameter's ``.grad`` the average of that gradient over all ranks. The grader really
runs it: 2 and 3 forked local processes (gloo over loopback, ``coursekit.dist.launch``), each
training a small seeded model on its own shard of the data with a manual data-parallel loop::

    loss.backward(); average_gradients(model); optimizer.step()

Around every call each rank records its gradients and parameters (before and after), and its
final parameters. The reference observation adds the same training done by torch's
``DistributedDataParallel`` and by one process on the full batch, which the checks compare with.

Correct behaviour for a parameter whose ``.grad`` is None (a frozen weight, or a layer this
forward pass did not use): leave it None, without crashing. Every rank runs the same model, so
every rank skips the same parameters and the collectives still pair up. This is what DDP does
(frozen weights are not registered; with ``find_unused_parameters=True`` globally unused ones
keep ``grad=None``); a zero gradient instead would let momentum or weight decay move weights
that received no gradient (tests/exercises/test_average_gradients.py checks both claims).
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="average_gradients",
    notebook="03_data_parallel.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    ranks=True,
    evidence=checks.ranks_really_averaged,
    timeout_s=60,  # three launches; a deadlocking submission spends LAUNCH_TIMEOUT_S in each
    checks=[
        Check("Every rank holds the same gradients after the call (all-reduce, not reduce)", 2,
              checks.check_same_on_every_rank, evidence=("two_ranks",)),
        Check("The gradient is the average: the sum over ranks divided by the world size (2 ranks)", 2,
              checks.check_average_two, evidence=("two_ranks",)),
        Check("Uses the real world size (3 ranks)", 2, checks.check_world_size),
        Check("Changes the gradients only, never the parameters", 1, checks.check_params_untouched,
              evidence=("two_ranks",)),
        Check("Leaves parameters without a gradient alone (frozen bias, unused layer)", 2, checks.check_no_grad_params,
              evidence=("no_grad_params",)),
        Check("Training with it matches DDP and one process on the full batch (2 ranks)", 2, checks.check_matches_ddp),
    ],
)
