"""Lesson 4 exercise: ``TensorParallelMLP(fc1, fc2)``, Megatron-LM's tensor-parallel MLP.

The student's class takes the full layers ``fc1: Linear(d_in, h)`` and ``fc2: Linear(h, d_out)`` (the same on
every rank; ``h`` divisible by the world size N) and keeps only this rank's shards: rows
``[r·h/N, (r+1)·h/N)`` of ``fc1.weight`` and ``fc1.bias`` (column-parallel), the same columns of ``fc2.weight``
(row-parallel) and the whole ``fc2.bias``, added once after the sum. ``forward(x)`` returns
``fc2(gelu(fc1(x)))`` on every rank, with Megatron's two operators as autograd functions: f (identity forward,
all-reduce backward) before the first layer, g (all-reduce forward, identity backward) after the second.

The grader really runs it: 2 and 3 forked local processes (gloo over loopback, ``coursekit.dist.launch``).
Each rank builds the same seeded layers, input and upstream gradient, constructs the student's module, runs
one forward and one backward, and records its output, ``x.grad``, its shards (found among the module's
parameters by their shapes) and their gradients. The grader's own instrumentation counts the collectives in
the forward and in the backward: torch's profiler records every gloo collective (``gloo:all_reduce``, …)
whichever Python API issued it (``dist.all_reduce``, async work, functional collectives). The reference
observation adds the single-process MLP's output and gradients, sliced per rank, which the checks compare with.

Not allowed: ``torch.distributed.tensor`` (``parallelize_module``, DTensor). It does the whole exercise for
you; a module whose parameters or output are DTensors earns no points (the lesson says so).
"""
from ..protocol import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="TensorParallelMLP",
    notebook="04_model_pipeline_parallel.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    ranks=True,
    evidence=checks.shards_really_computed,
    timeout_s=45,  # two launches; a deadlocking submission spends LAUNCH_TIMEOUT_S in each
    checks=[
        Check("Keeps this rank's shards: rows of fc1.weight and fc1.bias, columns of fc2.weight (2 ranks)", 2,
              checks.check_shards),
        Check("The output equals the single-process MLP's on every rank (2 ranks)", 2, checks.check_output,
              evidence=("two_ranks",)),
        Check("x.grad equals the single-process input gradient on every rank (2 ranks)", 2, checks.check_x_grad,
              evidence=("two_ranks",)),
        Check("Each shard's gradient is its slice of the single-process gradient (2 ranks)", 2, checks.check_weight_grads),
        Check("Output, x.grad and shard gradients are right on 3 ranks", 2, checks.check_three_ranks,
              evidence=("three_ranks",)),
        Check("Exactly one all-reduce in the forward pass (g)", 1, checks.check_forward_count,
              evidence=("two_ranks", "three_ranks")),
        Check("Exactly one all-reduce in the backward pass (f)", 1, checks.check_backward_count,
              evidence=("two_ranks", "three_ranks")),
    ],
)
