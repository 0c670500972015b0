"""Lesson 4 exercise: ``TensorParallelMLP(fc1, fc2)``, Megatron-LM's tensor-parallel MLP.

The student's class takes full-size layers ``fc1: Linear(d_in, h)`` and ``fc2: Linear(h, d_out)`` (``h`` divisible by
the world size N) and keeps only this rank's shards: rows
``[r·h/N, (r+1)·h/N)`` of ``fc1.weight`` and ``fc1.bias`` (column-parallel), the same columns of ``fc2.weight``
(row-parallel) and the whole ``fc2.bias``, added once after the sum. ``forward(x)`` returns
``fc2(gelu(fc1(x)))`` on every rank, with Megatron's two operators as autograd functions: f (identity forward,
all-reduce backward) before the first layer, g (all-reduce forward, identity backward) after the second.

The grader really runs it: 2 and 3 forked local processes (gloo over loopback, ``ranks.run_on_ranks``). Each rank
builds the seeded layers, input and upstream gradient, constructs the student's module, runs one forward and one
backward, and records its output, ``x.grad``, its shards (found among the module's parameters by their shapes) and
their gradients. Inputs that require the method: each rank's fc1 and fc2 hold the true values only in its own
block (its rows of fc1, its columns of fc2.weight; fc2.bias everywhere); the other blocks hold values drawn per
rank (``observe.poison``), so a rank that runs the whole MLP itself gets wrong values (issue 25's "full MLP on every
rank with shard-shaped parameters and two all_reduce(zeros(1))" scored 12/12 before; now 4/12). The rank's own
record counts the collectives in the forward and in the backward (torch's profiler, ``gloo:<kind>``, whatever Python
API issued them), as [kind, count] pairs. The reference observation adds the single-process MLP's output and
gradients, sliced per rank, which the checks compare with.

Method ("one all-reduce each way"), measured outside the ranks. The profiler's count lives in the student's process
(issue 25 replaced it: an all-gather TP scored 12/12), so the count checks earn their points only when the bytes on
the loopback agree. The ``traffic`` scenario: 2 ranks, d_in = d_out = 64, h = 4096, a batch of 1024, the same sizes
for every salt; between forward and backward each rank stops at a gate until all are there, and the launcher reads
the loopback's transmit counter (``StopAllAtGates``): the forward's bytes are the reading when the last rank arrives
(every forward done, no backward started), the backward's the rest of the scenario's ``lo_bytes``. The gate is the
launcher's (issue 37): each rank reports its whole output's digest there, exactly once, and the answer (a seed drawn
after the fork, the same for every rank) draws the backward's upstream gradient, so x.grad's sum travels only after
the reading; the launcher recomputes the output's digest and x.grad (``observe.expected_passes``). Each pass must
send within 1.5× of the reference's, measured the same way. Its evidence: every rank's first rows of the output
(and, for the backward check, of x.grad under the gate's upstream gradient) are the single-process MLP's, and so
are sketches of all of them. An all-reduce of B values on 2 ranks sends 2·B·4 bytes (gloo's ring) plus about
0.3 KiB; a gather of the hidden activations sends (N−1)·batch·h·4, of the weights (N−1)·h·(d_in + d_out + 1)·4:
32× and 4× the all-reduce here (h / 2·d_out and h / batch). What each style measured, and what
the scenario costs: ``docs/method-evidence.md``.
"""
from ..exercise import Check, Exercise
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
        Check("Exactly one all-reduce in the forward pass (g; bytes measured outside your ranks)", 1,
              checks.check_forward_count, evidence=("two_ranks", "three_ranks", "traffic")),
        Check("Exactly one all-reduce in the backward pass (f; bytes measured outside your ranks)", 1,
              checks.check_backward_count, evidence=("two_ranks", "three_ranks", "traffic")),
    ],
)
