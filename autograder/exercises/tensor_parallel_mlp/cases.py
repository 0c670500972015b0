"""The scenarios of ``TensorParallelMLP`` and the sizes of its layers (plain Python)."""
from ..scenarios import held_out_rng, salted_seed

ATOL = 1e-5             # float32 round-off between valid styles (F.linear vs matmul, order of the sum)
ROLES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")

SCENARIOS = {  # name: (world size, what it is: the words after "when")
    "two_ranks": (2, "called on 2 ranks"),
    "three_ranks": (3, "called on 3 ranks"),
}
PUBLIC_SIZES = {"d_in": 6, "per_rank": 4, "d_out": 3, "batch": 4}  # hidden size = per_rank × world size


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs. Held-out salts draw other sizes (every shard shape stays distinct: per_rank >
    d_out, so the grader can tell the module's parameters apart by shape) and other seeds."""
    found = {}
    for i, (name, (world_size, words)) in enumerate(SCENARIOS.items()):
        if salt == 0:
            sizes = dict(PUBLIC_SIZES)
        else:
            rng = held_out_rng(salt, f"sizes of {name}")
            sizes = {"d_in": rng.randint(5, 8), "per_rank": rng.randint(4, 6), "d_out": rng.randint(2, 3),
                     "batch": rng.randint(3, 6)}
        found[name] = {"what": words, "world_size": world_size, **sizes,
                       "hidden": sizes["per_rank"] * world_size, "seed": salted_seed(100 + i, salt)}
    return found
