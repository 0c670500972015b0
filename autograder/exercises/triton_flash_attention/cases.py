"""The scenarios of ``TritonFlashAttention`` and their sizes (plain Python).

Four scenarios launch the student's kernel with the grader's own grid (one program per query tile and
batch·head) and blocks, on sequences whose length is not a multiple of either block, in guarded buffers; one calls
the student's autograd Function, forward and backward.
"""
from ..scenarios import held_out_rng, salted_seed

FP32_RTOL = 1e-5     # o and L, normwise (max |error| / max |truth|) against float64; correct kernels: ~2e-7
GRAD_RTOL = 1e-4     # dq, dk, dv of the Function: a backward in float32 of any valid style; correct: ~1e-6
BF16_RTOL = 2e-2     # o of bfloat16 inputs (bf16's own round-off is 4e-3; correct kernels: ~5e-3)
STATS_RTOL = 1e-4    # L of bfloat16 inputs, kept in float32: ~1e-7; a running max or sum in bfloat16: ~1e-3
EVIDENCE_MIN_COS = 0.9  # the evidence: the first query tile's o (or centred L) points where the truth does
GUARD = 1024         # elements before and after every buffer the grader passes (more than a tile of BLOCK_M × D)
SENTINEL = 12345.0   # what an output buffer's guards hold, and the output itself before the launch
HEAD_DIM = 16        # d: the smallest that tl.dot takes

# name: (launch, causal, dtype, public sizes); launch: the grader's "kernel" launch, its "tiles" launches (one per
# query tile, keys past the tile's diagonal key tile NaN) or the student's "function"
SCENARIOS = {
    "full": ("kernel", False, "float32", {"heads": 2, "n": 45, "block_m": 32, "block_n": 16}),
    "causal": ("kernel", True, "float32", {"heads": 2, "n": 45, "block_m": 32, "block_n": 16}),
    "causal_tiles": ("tiles", True, "float32", {"heads": 1, "n": 45, "block_m": 16, "block_n": 16}),
    "bf16": ("kernel", False, "bfloat16", {"heads": 2, "n": 37, "block_m": 16, "block_n": 32}),
    "function": ("function", True, "float32", {"shape": [1, 2, 37, HEAD_DIM]}),
}


def describe(launch: str, causal: bool, dtype: str, sizes: dict) -> str:
    """The scenario in words that finish "... when ...", with its sizes (held-out ones included)."""
    mode = "causal" if causal else "non-causal"
    if launch == "function":
        return f"TritonFlashAttention.apply(q, k, v, True) ran on {dtype} {tuple(sizes['shape'])} inputs, then backward"
    blocks = f"BLOCK_M={sizes['block_m']}, BLOCK_N={sizes['block_n']}"
    if launch == "tiles":
        return (f"the grader launched your {mode} kernel ({blocks}) once per query tile of n={sizes['n']}, with NaN "
                "in the keys after that tile")
    return f"the grader launched your {mode} kernel ({blocks}) on {sizes['heads']}×{sizes['n']} {dtype} rows"


def _not_multiple(rng, low: int, high: int, *blocks: int) -> int:
    return next(n for n in iter(lambda: rng.randint(low, high), None) if all(n % b for b in blocks))


def held_out_sizes(name: str, salt: int) -> dict:
    """Other sizes for a role, keeping what its checks talk about: n not a multiple of either block, more than one
    key tile, BLOCK_N dividing BLOCK_M where the launch is causal."""
    rng = held_out_rng(salt, f"sizes of {name}")
    if name in ("full", "causal"):
        block_m, block_n = rng.choice([(32, 16), (16, 16)])
        return {"heads": 2, "n": _not_multiple(rng, 34, 60, block_m, block_n), "block_m": block_m, "block_n": block_n}
    if name == "causal_tiles":
        return {"heads": 1, "n": _not_multiple(rng, 34, 47, 16), "block_m": 16, "block_n": 16}
    if name == "bf16":
        return {"heads": 2, "n": _not_multiple(rng, 33, 47, 16, 32), "block_m": 16, "block_n": 32}
    return {"shape": [1, 2, _not_multiple(rng, 33, 47, 16), HEAD_DIM]}


def cases(salt: int) -> dict[str, dict]:
    found = {}
    for i, (name, (launch, causal, dtype, sizes)) in enumerate(SCENARIOS.items()):
        sizes = sizes if salt == 0 else held_out_sizes(name, salt)
        found[name] = {"what": describe(launch, causal, dtype, sizes), "launch": launch, "causal": causal,
                       "dtype": dtype, "d": HEAD_DIM, **sizes, "seed": salted_seed(500 + i, salt)}
    return found
