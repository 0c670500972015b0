"""The scenarios of ``train_with_accumulation`` and the sizes of its problems (plain Python)."""
from ..scenarios import salted_seed

IN, HIDDEN, OUT, BATCH = 8, 16, 4, 4
ATOL = 1e-5  # float32 round-off between valid styles (e.g. dividing the loss or the gradient)


DEFAULT_K = 4  # the function's default accumulation_steps
SCENARIOS = {  # name: (n_batches, k, what it is, options); k=None calls with the default
    "default": (8, None, "called with the default accumulation_steps", {}),
    "k1": (6, 1, "called with accumulation_steps=1", {}),
    "k2": (8, 2, "called with accumulation_steps=2", {}),
    "k3": (9, 3, "called with accumulation_steps=3", {}),
    "momentum": (8, 4, "training with SGD with momentum", {"momentum": 0.9}),
    "partial": (10, 4, "the number of batches is not a multiple of accumulation_steps", {}),
    "eval_dropout": (8, 2, "the model (with dropout) arrived in eval mode", {"dropout": True, "eval_first": True}),
    "stale": (8, 4, "the model arrived with gradients left over from earlier", {"stale_grads": True}),
}


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs; the seeds are public for salt 0 and held out for any other salt."""
    return {name: {"what": what, "n_batches": n, "k": k, "seed": salted_seed(i, salt), "dropout": False,
                   "momentum": 0.0, "eval_first": False, "stale_grads": False, **options}
            for i, (name, (n, k, what, options)) in enumerate(SCENARIOS.items())}
