"""The scenarios of ``TensorParallelMLP`` and the sizes of its layers (plain Python)."""
from ..scenarios import held_out_rng, salted_seed

ATOL = 1e-5             # float32 round-off between valid styles (F.linear vs matmul, order of the sum)
ROLES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")

SCENARIOS = {  # name: (world size, what it is: the words after "when")
    "two_ranks": (2, "called on 2 ranks"),
    "three_ranks": (3, "called on 3 ranks"),
    "traffic": (2, "called on 2 ranks with d_in = d_out = 64, h = 4096 and a batch of 1024 (bytes measured)"),
}
PUBLIC_SIZES = {"d_in": 6, "per_rank": 4, "d_out": 3, "batch": 4}  # hidden size = per_rank × world size
# The traffic scenario: Megatron's all-reduces carry (batch, d) = 256 KiB each way (512 KiB on the loopback, 2 ranks);
# an all-gather of the hidden activations (batch, h) sends 32 times that, an all-gather of the weights 4 times.
TRAFFIC_SIZES = {"d_in": 64, "per_rank": 2048, "d_out": 64, "batch": 1024}
TRAFFIC_RATIO = 1.5     # bytes of a pass within this factor of the reference's (measured: 0.97–1.03; gathers 4–33)
FINGERPRINT_ROWS = 4    # rows of the traffic scenario's output and x.grad kept (the evidence of real work)
SEEDED_X_GRAD = "x_grad_after_pause"  # the traffic scenario's x.grad, under the upstream gradient its gate's seed drew


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs. Held-out salts draw other sizes (every shard shape stays distinct: per_rank >
    d_out, so the grader can tell the module's parameters apart by shape) and other seeds; the traffic scenario
    keeps its sizes (the bytes it measures are compared with the reference's)."""
    found = {}
    for i, (name, (world_size, words)) in enumerate(SCENARIOS.items()):
        if name == "traffic":
            sizes = dict(TRAFFIC_SIZES)
        elif salt == 0:
            sizes = dict(PUBLIC_SIZES)
        else:
            rng = held_out_rng(salt, f"sizes of {name}")
            sizes = {"d_in": rng.randint(5, 8), "per_rank": rng.randint(4, 6), "d_out": rng.randint(2, 3),
                     "batch": rng.randint(3, 6)}
        found[name] = {"what": words, "world_size": world_size, **sizes,
                       "hidden": sizes["per_rank"] * world_size, "seed": salted_seed(100 + i, salt),
                       "measure_traffic": name == "traffic"}
    return found
