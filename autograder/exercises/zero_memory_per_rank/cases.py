"""The scenarios of ``zero_memory_per_rank``: the paper's example and held-out numbers (plain Python)."""
from ..scenarios import held_out_rng

PAPER = (7_500_000_000, 64)
BUFFERS = ("weights", "gradients", "optimizer state")
DEFAULT = (2, 2, 12)
SHARDED = {0: (), 1: (2,), 2: (1, 2), 3: (0, 1, 2)}  # which of the three buffers each stage divides by N
STAGES = range(4)

# The public scenarios: role: (num_params, world_size, bytes_per_param or None for the default). Each is called
# with every stage 0-3. Held-out scenarios keep the roles and draw new numbers (see held_out_cases).
CASES = {
    "paper": (*PAPER, None),
    "even": (10_000_000, 8, None),
    "odd_small": (1000, 7, None),
    "odd_large": (1_000_001, 3, None),
    "odd_layout": (12_345, 5, (2, 4, 12)),
    "fp32_grads": (24_000_000, 16, (2, 4, 12)),
    "fp32_adam": (3_000_000, 6, (4, 4, 8)),
    "world_1": (123_457, 1, None),
    "huge": (175_000_000_000, 1024, (2, 4, 12)),
}
INVALID = (1000, 4, (4, -1))  # num_params, world_size, stages outside 0-3
LAYOUTS = [(2, 4, 12), (4, 4, 8), (4, 4, 4), (2, 2, 8)]  # real ones besides the default: fp32 grads, Adam, SGD
RTOL = 1e-9  # exact arithmetic up to float round-off


def held_out_cases(salt: int) -> tuple[dict, tuple]:
    """Every role with new numbers for a non-zero salt (odd world sizes stay odd and do not divide num_params)."""
    rng = held_out_rng(salt, "zero_memory_per_rank")

    def odd(low, high):
        world = rng.choice([3, 5, 7, 9, 11, 13])
        return next(n for n in iter(lambda: rng.randrange(low, high), None) if n % world), world

    found = {
        "paper": (*PAPER, None),  # the paper's example is public by nature: its check's title quotes it
        "even": (rng.randrange(10**6, 10**8), rng.choice([2, 4, 8, 16, 32, 64]), None),
        "odd_small": (*odd(100, 10_000), None),
        "odd_large": (*odd(10**6, 10**7), None),
        "odd_layout": (*odd(10_000, 100_000), rng.choice(LAYOUTS)),
        "fp32_grads": (rng.randrange(10**6, 10**8), rng.choice([2, 4, 8, 16, 32]), (2, 4, 12)),
        "fp32_adam": (rng.randrange(10**6, 10**7), rng.choice([2, 4, 6, 8, 12]), (4, 4, 8)),
        "world_1": (rng.randrange(10_000, 10**6), 1, None),
        "huge": (rng.randrange(10, 1000) * 10**9, rng.choice([256, 512, 1024, 2048]), (2, 4, 12)),
    }
    return found, (rng.randrange(100, 10_000), rng.choice([2, 4, 8]), (rng.choice([4, 5, 7]), rng.choice([-1, -2])))


def cases(salt: int) -> dict[str, dict]:
    roles, (n, world, stages) = (CASES, INVALID) if salt == 0 else held_out_cases(salt)
    found = {role: {"what": f"called with {_what(n, world, layout)}", "num_params": n, "world_size": world,
                    "bytes_per_param": list(layout) if layout else None}
             for role, (n, world, layout) in roles.items()}
    found["invalid"] = {"what": f"called with an invalid stage ({_what(n, world)})", "num_params": n,
                        "world_size": world, "bytes_per_param": None, "stages": list(stages)}
    return found


def _what(n, world, layout=None, stage=None):
    return (f"num_params={n:,}, world_size={world}" + (f", stage={stage}" if stage is not None else "")
            + (f", bytes_per_param={tuple(layout)}" if layout else ""))
