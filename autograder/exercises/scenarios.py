"""Drawing scenarios: public seeds for salt 0, held-out ones for any other salt (plain Python, no torch)."""
import random


def salted_seed(seed: int, salt: int) -> int:
    """``seed`` itself for the public scenarios (salt 0); for any other salt a seed derived from both."""
    return seed if salt == 0 else held_out_rng(salt, f"seed {seed}").randrange(1_000_000, 2**31)


def held_out_rng(salt: int, purpose: str) -> random.Random:
    """A generator for drawing held-out scenarios: the same (salt, purpose), the same draws, on any machine."""
    return random.Random(f"{purpose} / salt {salt}")  # a str seed is hashed with SHA-512: no PYTHONHASHSEED
