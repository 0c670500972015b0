"""The scenarios of ``FusedLayerNorm`` and their sizes (plain Python).

Four scenarios launch the student's kernels with the grader's own grid (one program per row) and BLOCK, on rows
whose length is not a multiple of BLOCK, in guarded buffers; one calls the student's autograd Function.
"""
from ..scenarios import held_out_rng, salted_seed

FP32_RTOL = 1e-5     # normwise (max |error| / max |truth|) against float64; correct float32 kernels: ~4e-7
BF16_RTOL = 2e-2     # y and dx in bfloat16; correct kernels: ~8e-3 (bf16's own round-off is 4e-3)
STATS_RTOL = 1e-4    # mean and rstd (float32) of bfloat16 rows; statistics in float32: ~1e-7, in bfloat16: ~1e-2
EVIDENCE_MIN_COS = 0.9  # the evidence: every row but the last points where the truth does
EPS = 1e-5
GUARD = 64           # elements before and after every buffer the grader passes to a kernel
SENTINEL = 12345.0   # what an output buffer's guards hold (an input's hold NaN, so that a read past the end shows)
BF16_MEAN = 8.0      # the bfloat16 rows' mean: a sum in bfloat16 then loses most of its digits

# name: (launch, dtype, public sizes); launch: "forward" or "backward" kernel, "kernels" (both) or the "function"
SCENARIOS = {
    "forward": ("forward", "float32", {"rows": 6, "cols": 37, "block": 16}),
    "backward": ("backward", "float32", {"rows": 6, "cols": 37, "block": 16}),
    "short_rows": ("kernels", "float32", {"rows": 3, "cols": 20, "block": 64}),
    "bf16": ("kernels", "bfloat16", {"rows": 4, "cols": 53, "block": 32}),
    "function": ("function", "float32", {"lead": [2, 7], "cols": 45}),
}


def describe(launch: str, dtype: str, sizes: dict) -> str:
    """The scenario in words that finish "... when ...", with its sizes (held-out ones included)."""
    if launch == "function":
        shape = (*sizes["lead"], sizes["cols"])
        return f"FusedLayerNorm.apply was called on x of shape {shape} in {dtype}, then backward"
    which = {"forward": "your forward kernel", "backward": "your backward kernel", "kernels": "both your kernels"}
    mean = f", mean near {BF16_MEAN:g}" if dtype == "bfloat16" else ""
    return (f"the grader launched {which[launch]} with BLOCK={sizes['block']} on {sizes['rows']} rows of "
            f"{sizes['cols']} {dtype} features{mean}")


def _not_multiple(rng, low: int, high: int, block: int) -> int:
    return next(n for n in iter(lambda: rng.randint(low, high), None) if n % block and n & (n - 1))


def held_out_sizes(name: str, salt: int) -> dict:
    """Other sizes for a role, keeping what its checks talk about: rows longer than BLOCK and not a multiple of it
    (forward, backward, bf16), rows shorter than BLOCK (short_rows), a leading shape (function)."""
    rng = held_out_rng(salt, f"sizes of {name}")
    if name in ("forward", "backward"):
        block = rng.choice([16, 32])
        return {"rows": rng.randint(4, 7), "cols": _not_multiple(rng, block + 1, 3 * block - 1, block), "block": block}
    if name == "short_rows":
        return {"rows": 3, "cols": _not_multiple(rng, 9, 31, 64), "block": 64}
    if name == "bf16":
        return {"rows": 4, "cols": _not_multiple(rng, 33, 63, 32), "block": 32}
    return {"lead": [2, rng.randint(5, 8)], "cols": _not_multiple(rng, 33, 63, 16)}


def cases(salt: int) -> dict[str, dict]:
    found = {}
    for i, (name, (launch, dtype, sizes)) in enumerate(SCENARIOS.items()):
        sizes = sizes if salt == 0 else held_out_sizes(name, salt)
        found[name] = {"what": describe(launch, dtype, sizes), "launch": launch, "dtype": dtype, **sizes,
                       "mean": BF16_MEAN if dtype == "bfloat16" else 0.0, "seed": salted_seed(400 + i, salt)}
    return found
