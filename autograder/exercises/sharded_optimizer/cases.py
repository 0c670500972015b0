"""The scenarios of ``ShardedOptimizer`` and the sizes of its model (plain Python)."""
from ..scenarios import salted_seed

IN, HIDDEN, OUT, BATCH = 6, 8, 4, 16
STEPS = 3
PARAM_ATOL = 1e-6        # float32 round-off between valid styles (per tensor or one flat shard)
# The memory scenario: AdamW's state (2 values per parameter) dominates what a rank holds between steps. 8 tensors
# of 512 × 512 float32 (8 MiB of parameters, 16 MiB of unsharded state) on 4 ranks, new gradients before each of
# 2 steps (the second step needs the first one's state, so a rank that steps everything must keep all of it).
# Margin: unsharded, a rank holds 12 MiB more state than a sharded one (4 MiB); the check allows half of that.
LARGE_TENSORS, LARGE_SHAPE, MEMORY_STEPS = 8, (512, 512), 2
CHECKSUM_RTOL = 1e-5     # per tensor, relative to its norm: round-off between styles; a tensor not stepped is ~1e-2 off


# name: (world size, optimizer, model, what it is: the words after "when")
SCENARIOS = {
    "adamw_two": (2, "AdamW", "mlp", "AdamW with weight decay runs on 2 ranks"),
    "sgd_three": (3, "SGD", "mlp", "SGD with momentum runs on 3 ranks"),
    "groups": (2, "AdamW", "groups", "two parameter groups with their own lr and weight_decay run on 2 ranks, and a "
               "third group is added with add_param_group after the first step"),
    "few_params": (3, "SGD", "tiny", "a model with 2 parameter tensors runs on 3 ranks (one rank owns nothing)"),
    "memory": (4, "AdamW", "large", "AdamW runs on 4 ranks over 8 parameter tensors of 512 × 512 (8 MiB), two "
               "steps (memory measured)"),
}


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs; the seeds are public for salt 0 and held out for any other salt."""
    return {name: {"what": words, "world_size": world_size, "optimizer": optimizer, "model": model,
                   "steps": MEMORY_STEPS if model == "large" else STEPS, "model_seed": salted_seed(100 + i, salt),
                   "data_seed": salted_seed(200 + i, salt)}
            for i, (name, (world_size, optimizer, model, words)) in enumerate(SCENARIOS.items())}
