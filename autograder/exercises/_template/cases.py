"""The scenarios: a table of roles; ``cases(salt)`` gives each its inputs (plain Python, no torch)."""
from ..scenarios import salted_seed

IN, OUT = 5, 3
ATOL = 1e-6  # float32 round-off between valid styles (one norm over all vs. per-parameter norms combined)

SCENARIOS = {  # name: (max_norm, what it is: the words after "when")
    "large": (0.1, "the gradients are larger than max_norm"),
    "small": (1000.0, "the gradients are already smaller than max_norm"),
}


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs, JSON-like: public seeds for salt 0, held-out ones for any other salt.

    Keep the roles and the sizes the checks' hints talk about; change only what the salt should hide
    (seeds here; sizes too for an arithmetic exercise, drawn with ``held_out_rng(salt, ...)``).
    """
    return {name: {"what": words, "max_norm": max_norm, "seed": salted_seed(i, salt)}
            for i, (name, (max_norm, words)) in enumerate(SCENARIOS.items())}
