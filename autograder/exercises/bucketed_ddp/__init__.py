"""Lesson 3 exercise: ``BucketedDDP(module, bucket_size_mb)``, data parallel with buckets and overlap.

The student's ``torch.nn.Module`` wraps a model on every rank of an initialised process group:
``__init__`` broadcasts rank 0's parameters and groups the trainable ones into buckets of about
``bucket_size_mb`` MiB; hooks fire as each gradient is accumulated during ``backward()`` and launch an
asynchronous all-reduce of a bucket as soon as all of its gradients are there;
``finish_gradient_synchronization()`` (after ``backward()``, before ``optimizer.step()``) waits for them
all and leaves every ``.grad`` holding the average over ranks.

The grader really runs it on 2 and 3 forked gloo ranks, training a tiny seeded token model for a few
steps with SGD + momentum, and records per step every rank's gradients after the call, and the final
parameters. Its own instrumentation in each rank (``Instrument``) logs, in order: each gradient becoming
ready (the grader's post-accumulate hooks, registered before the student's), each ``dist.all_reduce`` the
student issues (with its size), each ``wait()`` on what it returned (a synchronous call waits at once),
and the end of ``backward()``. The reference observation adds the same training done by
torch's ``DistributedDataParallel`` (``find_unused_parameters=True`` where a parameter is unused), which
the checks compare with.

Overlap is measured from outside the ranks (``beside/meter.py``, ``OverlapGates``), never on timings: in a gated
6-layer model the launcher holds the other rank while rank 0 must compute one more layer (a synchronous all-reduce
would block it there), then holds rank 0 while at least a bucket's bytes must cross the ranks' loopback (an
all-reduce started only after ``backward()`` has sent nothing yet); where the ranks' network is private, bytes beyond
the reference's are capped (``cases.SPARE_BUCKETS``). The in-rank event log only words the feedback. The counts earn
points only with data evidence (the evidence rule): the first step's averaged gradients point where DDP's do.

Wrapping torch's own ``DistributedDataParallel`` is not this exercise (the lesson says so): a submission
that constructs one earns nothing, with a sentence saying why.
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="BucketedDDP",
    notebook="03_data_parallel.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    ranks=True,
    evidence=checks.averaged_for_real,
    timeout_s=90,  # five launches; a deadlocking submission spends LAUNCH_TIMEOUT_S in each
    checks=[
        Check("Gradients and trained parameters match DDP with one bucket (2 ranks)", 1, checks.check_one_bucket),
        Check("Gradients and trained parameters match DDP with one bucket per parameter (2 ranks)", 1,
              checks.check_per_param),
        Check("Gradients and trained parameters match DDP with buckets in between (2 ranks)", 2, checks.check_mid),
        Check("Broadcasts rank 0's parameters and matches DDP on 3 ranks", 2, checks.check_three_ranks),
        Check("Handles a frozen bias, an unused layer and tied weights as DDP does", 2, checks.check_special),
        Check("One all-reduce per bucket, of the bucket size asked for", 1, checks.check_buckets,
              evidence=("one_bucket", "per_param", "mid")),
        Check("Overlaps: all-reduces run while backward still computes (measured from outside the ranks)", 2,
              checks.check_overlap),
    ],
)
