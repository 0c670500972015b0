"""The scenarios of ``Checkpointer`` and the sizes of its runs (plain Python)."""
from ..scenarios import held_out_rng, salted_seed

STEPS = 6                          # every run's length: the data loader's epoch (5 batches) ends inside it
ROWS, GLOBAL_BATCH, LR = 40, 8, 0.02
SIZES = (6, 10, 7, 1)              # Linear widths: rows of 10, 7 and 1 split unevenly over 3 ranks (two empty)
MODEL_SEED, DATA_SEED = 2024, 9
SAME_RTOL = 1e-6                   # same world size: the same sums in the same order (float32 round-off at most)
RESIZE_ATOL = 1e-4                 # another world size: the gradient's sum over ranks in another order (stated)
# The memory scenario: MEMORY_LAYERS × Linear(WIDTH, WIDTH) sharded over 2 ranks, one step, one save. Its whole
# state (weights and AdamW's two moments) is 3 × 4 × 1.05 MB ≈ 12 MiB: 6 MiB a rank, one file each, under the
# sandbox's 8 MiB per file. Measured: the reference's peak 12.7 to 13.6 MiB a rank, a rank that gathers holds 10 more.
WIDTH, MEMORY_LAYERS = 512, 4
STATE_BYTES = 3 * MEMORY_LAYERS * (WIDTH * WIDTH + WIDTH) * 4
GATHERED_SHARE = 0.5               # over the reference's peak on some rank: half the whole state is a gather

SCENARIOS = {  # name: (ranks before the kill, ranks after, the save the kill cuts off, what it is)
    "same_size": (2, 2, False, "killed after a save on 2 ranks and resumed on 2 ranks"),
    "resize": (2, 3, True, "killed during a save on 2 ranks and resumed on 3 ranks"),
    "memory": (2, 2, False, f"saving {MEMORY_LAYERS} layers of {WIDTH}×{WIDTH} and AdamW's state from 2 ranks "
                            "(memory measured outside the ranks)"),
}


def kill_after(salt: int, name: str) -> int:
    """The save after which the grader kills the ranks: public 4, held-out any of 2..5. Both resumed scenarios resume
    from the same killed run (one launch fewer): one as the kill left it, the other after the cut."""
    if name == "memory":
        return 1
    return 4 if salt == 0 else held_out_rng(salt, "kill step").randint(2, STEPS - 1)


def expected_step(case: dict) -> int:
    """The step load() must return: the last save the kill left complete."""
    return case["kill_after"] - 1 if case["cut_off"] else case["kill_after"]


def cases(salt: int) -> dict[str, dict]:
    return {name: {"what": words, "killed_on": before, "world_size": after, "cut_off": cut,
                   "kill_after": kill_after(salt, name), "memory": name == "memory", "steps": 1 if name == "memory" else STEPS,
                   "model_seed": salted_seed(MODEL_SEED, salt), "data_seed": salted_seed(DATA_SEED, salt),
                   "sizes": [WIDTH] * (MEMORY_LAYERS + 1) if name == "memory" else list(SIZES)}
            for name, (before, after, cut, words) in SCENARIOS.items()}
