"""The scenarios of ``FlashAttention`` and their sizes (plain Python)."""
from ..scenarios import held_out_rng, salted_seed

FP32_RTOL = 5e-5    # normwise relative error against float64 SDPA; correct float32 styles: ~1e-6
BF16_RTOL = 2e-2    # bf16 inputs and results; correct styles: ~6e-3
EVIDENCE_RTOL = 0.1  # the evidence: the output points where attention's does (a wrong method still passes this)
MEMORY_N, MEMORY_D = 2048, 32  # an n × n float32 matrix is 16 MiB; q, k, v, o 256 KiB each
# Tile sizes the grader sets in the memory scenario: 8 × 8 tile pairs, so the loops stay short (16 would take seconds).
# A tile (256 KiB) and the few a backward step holds stay far below the margin, half an n × n matrix (8 MiB).
MEMORY_BLOCK = 256
# ... and in every value scenario, whatever the student's cell chose: its lengths span several tiles of 16 (a larger
# tile would hold a whole row of keys, and an online softmax that never rescales would pass unseen).
VALUE_BLOCK = 16
FINGERPRINT_ROWS = 8  # rows of o and dq kept from the memory scenario (its full tensors are large)

# name: (what it is, dtype, is_causal, logit scale (None: plain randn), public sizes)
SCENARIOS = {
    "plain": ("called in float32, not causal, lengths a multiple of the tile", "float32", False, None,
              {"lead": [2, 2], "n_q": 32, "n_k": 32, "d": 8}),
    "ragged": ("called in float32 with n_q ≠ n_k, lengths not multiples of the tile, one leading dimension",
               "float32", False, None, {"lead": [2], "n_q": 21, "n_k": 53, "d": 8}),
    "causal": ("called in float32 with is_causal=True", "float32", True, None,
               {"lead": [1, 2], "n_q": 37, "n_k": 37, "d": 8}),
    "large_logits": ("called in float32 with scaled scores near 100", "float32", False, 100.0,
                     {"lead": [1, 2], "n_q": 40, "n_k": 40, "d": 8}),
    "bf16": ("called with bfloat16 inputs, is_causal=True", "bfloat16", True, None,
             {"lead": [1, 2], "n_q": 41, "n_k": 41, "d": 8}),
    "memory": (f"called on one head of {MEMORY_N} queries and keys (memory measured)", "float32", False, None,
               {"lead": [1, 1], "n_q": MEMORY_N, "n_k": MEMORY_N, "d": MEMORY_D}),
}


def _ragged(rng, low: int, high: int) -> int:
    """A length in [low, high] that is not a multiple of 16 (the default tile)."""
    return next(n for n in iter(lambda: rng.randint(low, high), None) if n % 16)


def held_out_sizes(name: str, salt: int) -> dict:
    """Other sizes for a role, keeping what its checks talk about (multiples of the tile or not, n_q ≠ n_k)."""
    rng = held_out_rng(salt, f"sizes of {name}")
    if name == "plain":
        n = rng.choice([32, 48])
        return {"lead": [2, 2], "n_q": n, "n_k": n, "d": 8}
    if name == "ragged":
        return {"lead": [2], "n_q": _ragged(rng, 17, 31), "n_k": _ragged(rng, 33, 63), "d": 8}
    if name == "memory":
        return {"lead": [1, 1], "n_q": MEMORY_N, "n_k": MEMORY_N, "d": MEMORY_D}
    n = _ragged(rng, 33, 47)
    return {"lead": [1, 2], "n_q": n, "n_k": n, "d": 8}


def cases(salt: int) -> dict[str, dict]:
    found = {}
    for i, (name, (words, dtype, causal, logits, sizes)) in enumerate(SCENARIOS.items()):
        found[name] = {"what": words, "dtype": dtype, "is_causal": causal, "logits": logits,
                       **(sizes if salt == 0 else held_out_sizes(name, salt)), "seed": salted_seed(300 + i, salt),
                       "measure_memory": name == "memory", "block": MEMORY_BLOCK if name == "memory" else VALUE_BLOCK}
    return found
