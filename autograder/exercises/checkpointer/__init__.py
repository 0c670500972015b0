"""Lesson 9 exercise: ``Checkpointer``, checkpoints that survive a kill and load on another number of ranks.

``Checkpointer(directory, model, optimizer, loader)`` with ``save(step)`` (every rank calls it after ``step`` steps)
and ``load() -> step or None`` (every rank calls it first: restores the newest complete checkpoint into model,
optimizer, loader and torch's RNG and returns its step, or None when there is none).

The grader trains a small seeded model, sharded by rows over the ranks (DTensors, as FSDP2 keeps them) with AdamW on
forked gloo ranks, saving after every step. From outside the ranks it kills them at a step it chooses; in one
scenario it then cuts the newest save back to what a kill in the middle of it leaves. A fresh model on another
number of ranks then calls ``load()`` and trains to the end; the checks compare the loaded step, what each resumed
step read, AdamW's state after loading and the final parameters with a run that never failed. The launcher's answer
at the gate after each save is a seed that weighs the next step's samples, so a checkpoint's state follows from the
seeds only the killed run was given (no ``load()`` rebuilds it by replaying the training from the case's seeds); the
launcher reruns the never-failed run under them for each student. A memory scenario measures each rank's peak from
outside while it saves a 12 MiB state.
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="Checkpointer",
    notebook="09_failures.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    ranks=True,
    evidence=checks.checkpointed_for_real,
    timeout_s=150,  # four launches; a deadlocking submission spends observe.LAUNCH_S in each
    # torch.distributed.checkpoint imports parts of FSDP and tensor parallelism, which MiniFSDP's and
    # TensorParallelMLP's students must not have: this exercise is graded in a worker that keeps them
    needs_libraries=("torch/distributed/fsdp", "torch/distributed/tensor/parallel"),
    ranks_share_files=True,  # the ranks write one checkpoint folder, which the next launch reads
    checks=[
        Check("Resumed on the same number of ranks, ends with the parameters of a run that never failed", 2,
              checks.check_same_size, evidence=("same_size",)),
        Check("Resumed on another number of ranks after a kill during a save, ends with the parameters of a run "
              "that never failed", 3, checks.check_resize, evidence=("resize",)),
        Check("load() returns the step of the newest complete checkpoint (a save cut off by the kill is skipped)", 2,
              checks.check_loaded_step, evidence=("same_size", "resize")),
        Check("No step lost or repeated: the resumed run reads the batches and random numbers of the run that never "
              "failed", 1, checks.check_no_step_lost, evidence=("same_size", "resize")),
        Check("AdamW's moments and step come back, resharded to the new number of ranks", 2, checks.check_optimizer),
        Check("Each rank saves only its own shards, never the gathered state (memory measured outside the ranks)", 2,
              checks.check_shards_only, evidence=("memory",)),
    ],
)
