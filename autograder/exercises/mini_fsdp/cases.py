"""The scenarios of ``MiniFSDP`` and the sizes of its model (plain Python)."""
from ..scenarios import held_out_rng, salted_seed

BATCH, STEPS, LR = 4, 3, 0.1
MODEL_SEED, DATA_SEED = 2024, 7
# Public widths of the Linear layers. On 2 ranks every flat layer has an even size (so a wrong padding still
# earns the 2-rank checks); on 3 ranks the flat layers hold 35, 40 and 18 values: two need padding.
SIZES = {2: (5, 6, 4, 2), 3: (4, 7, 5, 3)}
FP32_RTOL = 1e-5                   # float32 round-off: sum order of a norm, 3-rank averages (2 ranks: exact)
BF16_RTOL = 1e-2                   # bf16 compute: a valid style may round once more or less than FSDP2
PARAM_ATOL = 1e-5                  # fp32 master weights after STEPS steps (bf16 master weights: ~1e-3 off)
SLACK_BYTES = 64                   # bookkeeping a wrapper may hold (a scalar or two)
# The memory scenario: MEMORY_LAYERS × Linear(WIDTH, WIDTH), the grader's gates between them, one step on 2 ranks.
# A full layer is about 2.25 MiB; a wrapper that keeps every gathered layer for backward holds 6 more of them at the
# first pause in backward than one that gathers each layer again when its backward needs it. (Width 1024 gave the
# same margins in layers at twice the cost per student: the allocator's noise is well under a layer either way.)
WIDTH, MEMORY_LAYERS, MEMORY_BATCH = 768, 8, 16
LAYER_BYTES = (WIDTH * WIDTH + WIDTH) * 4
EXTRA_LAYERS = 2                   # over the reference's peak at a pause: a prefetched layer, and the allocator

SCENARIOS = {  # name: (world size, param_dtype, what it is)
    "fp32_two": (2, None, "trained on 2 ranks in float32"),
    "fp32_three": (3, None, "trained on 3 ranks in float32 (a layer's size is not divisible by 3)"),
    "bf16_two": (2, "bfloat16", "trained on 2 ranks with param_dtype=torch.bfloat16"),
    "memory": (2, None, f"{MEMORY_LAYERS} layers of {WIDTH}×{WIDTH} run one step on 2 ranks, the grader pausing each "
                        "rank's backward between layers to measure its memory"),
}


def _sizes(salt: int, world_size: int) -> list[int]:
    """Widths as in SIZES: on 2 ranks even flat layers; on 3 ranks at least two layers that need padding."""
    if salt == 0:
        return list(SIZES[world_size])
    rng = held_out_rng(salt, f"sizes for {world_size} ranks")
    while True:
        sizes = [rng.randint(3, 6), rng.randint(5, 9), rng.randint(4, 8), rng.randint(2, 4)]
        numels = [(a + 1) * b for a, b in zip(sizes, sizes[1:])]
        if all(n % 2 == 0 for n in numels) if world_size == 2 else sum(n % 3 != 0 for n in numels) >= 2:
            return sizes


def cases(salt: int) -> dict[str, dict]:
    return {name: {"what": words, "world_size": n, "param_dtype": dtype, "model_seed": salted_seed(MODEL_SEED, salt),
                   "data_seed": salted_seed(DATA_SEED, salt),
                   **({"sizes": [WIDTH] * (MEMORY_LAYERS + 1), "steps": 1, "gated": True} if name == "memory" else
                      {"sizes": _sizes(salt, n), "steps": STEPS, "gated": False})}
            for name, (n, dtype, words) in SCENARIOS.items()}


def layer_numels(case: dict) -> list[int]:
    sizes = case["sizes"]
    return [(a + 1) * b for a, b in zip(sizes, sizes[1:])]
