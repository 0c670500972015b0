"""The scenarios of ``average_gradients`` and the sizes of its problem (plain Python)."""
from ..scenarios import salted_seed

IN, HIDDEN, OUT = 6, 5, 3
BATCH, STEPS = 4, 3                 # per-rank micro-batch, optimizer steps
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 0.01
MODEL_SEED, DATA_SEED = 1234, 99    # the public scenarios' seeds (salt 0)
GRAD_ATOL, PARAM_ATOL = 1e-6, 1e-5  # float32 round-off between valid styles (sum order, *1/N vs /N)

SCENARIOS = {  # name: (world size, model with an unused layer and a frozen bias?, what it is)
    "two_ranks": (2, False, "called on 2 ranks"),
    "three_ranks": (3, False, "called on 3 ranks"),
    "no_grad_params": (2, True, "the model has an unused layer and a frozen bias (their .grad is None)"),
}


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs; the seeds are public for salt 0 and held out for any other salt."""
    return {name: {"what": what, "world_size": world_size, "with_unused": with_unused, "steps": STEPS,
                   "model_seed": salted_seed(MODEL_SEED, salt), "data_seed": salted_seed(DATA_SEED, salt)}
            for name, (world_size, with_unused, what) in SCENARIOS.items()}
