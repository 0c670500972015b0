"""Lesson 5 exercise: ``MiniFSDP``, a minimal fully sharded data parallel wrapper.

``MiniFSDP(module: nn.Sequential, param_dtype=None)`` flattens each child's parameters, pads them to a
multiple of the world size and keeps only this rank's shard (fp32); ``forward(*inputs)`` all-gathers a layer
just before it runs (in ``param_dtype`` when given) and frees it after; ``finish_gradient_synchronization()``
leaves in every shard's ``.grad`` its reduce-scattered, averaged gradient; ``gather_full_params()`` returns the
full fp32 state dict on every rank.

The grader trains a small seeded ``nn.Sequential`` with it on 2 and 3 forked ranks (gloo), a few SGD steps on
the shards, and records per rank and step: the loss, the global gradient norm (from the gradient shards), and
the bytes of tensors the wrapper holds, measured by the grader's own forward pre-hooks on every child (between
layers), after each step and after the synchronisation; plus ``gather_full_params()`` at the end. The reference
observation adds the same training with torch's FSDP2 (``fully_shard`` on every child and the root, also on
gloo/CPU in torch 2.13), whose losses, gradient norms and parameters the checks compare with.

Calling torch's FSDP (``fully_shard``, ``FullyShardedDataParallel``) inside the wrapper is not an answer to
this exercise: every check says so and it earns nothing (the lesson says it too).
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="MiniFSDP",
    notebook="05_fsdp_zero.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    ranks=True,
    evidence=checks.trained_for_real,
    timeout_s=90,  # three launches; a deadlocking submission spends LAUNCH_TIMEOUT_S in each
    checks=[
        Check("Losses and gradient norms match FSDP2 step by step (float32, 2 ranks)", 3, checks.check_fp32_two),
        Check("Matches FSDP2 on 3 ranks, with layer sizes not divisible by 3 (padding)", 2, checks.check_fp32_three),
        Check("gather_full_params() returns FSDP2's trained float32 parameters", 1, checks.check_full_params),
        Check("With param_dtype=bfloat16, losses and gradient norms match FSDP2 within tolerance", 1, checks.check_bf16),
        Check("With param_dtype=bfloat16, the master weights stay float32", 1, checks.check_fp32_master),
        Check("Each rank keeps only its shard of every layer between steps", 1, checks.check_keeps_shard,
              evidence=("fp32_two",)),
        Check("Frees each gathered layer after its forward and gathers it again for backward (memory measured "
              "outside the ranks)", 2, checks.check_frees_layers),
        Check("Keeps only the gradient shard after synchronisation (reduce-scatter, not all-reduce)", 1,
              checks.check_grad_shards, evidence=("fp32_two",)),
    ],
)
