"""The scenarios of ``train_amp`` and the sizes of its problems (plain Python)."""
from ..scenarios import salted_seed

IN, HIDDEN, OUT, BATCH, N_BATCHES = 8, 16, 4, 4, 6
OVERFLOW_BATCH = 2   # this batch's inputs are 100x larger: its scaled fp16 gradients overflow
OUTLIER = 100.0
# Valid styles run the same low-precision ops, so on one device their results agree exactly (measured);
# 2e-5 leaves room for a different summation order on a GPU while staying well below the gap between an
# fp16 and an fp32 epoch of the default scenario (1.2e-4), let alone a wrong update (1e-2 and more).
ATOL = 2e-5
CLIP_NORM = 0.01  # below the gradient norm of every batch of every seed's problem: every step clips (measured)


# The given scaler starts too high for this model's fp16 gradients (so its first steps overflow and are
# skipped) and grows after every GIVEN_GROWTH clean steps: its scale moves in both epochs, and the second
# epoch's start depends on where the first left it.
GIVEN_INIT_SCALE, GIVEN_GROWTH, GIVEN_EPOCHS = 2.0**20, 2, 2


SCENARIOS = {  # name: (what it is, options); dtype None calls with the default
    "fp16_default": ("called with the default dtype", {}),
    "bf16": ("called with dtype=torch.bfloat16", {"dtype": "bfloat16"}),
    "fp16_overflow": ("one fp16 batch overflows", {"dtype": "float16", "outlier_batch": OVERFLOW_BATCH}),
    "eval_dropout": ("the model (with dropout) arrived in eval mode",
                     {"dtype": "bfloat16", "dropout": True, "eval_first": True}),
    "given_scaler": ("called once per epoch for two epochs with one GradScaler passed as scaler=",
                     {"dtype": "float16", "given_scaler": True, "init_scale": GIVEN_INIT_SCALE,
                      "growth_interval": GIVEN_GROWTH, "epochs": GIVEN_EPOCHS}),
    "fp16_clipped": (f"called with max_norm={CLIP_NORM}, below every batch's gradient norm", {"dtype": "float16",
                                                                                         "max_norm": CLIP_NORM}),
}
ON_CUDA = ("fp16_default", "bf16", "fp16_overflow", "fp16_clipped")  # also observed on a GPU when the grader has one


def cases(salt: int, devices: tuple[str, ...] = ("cpu",), bf16_on_cuda: bool = True) -> dict[str, dict]:
    """Every scenario's inputs, on the CPU and (some) on each other device given (key ``name@cuda``); the seeds
    are public for salt 0 and held out for any other salt. The observer says which devices this machine has."""
    found = {}
    for device in devices:
        for i, (name, (words, options)) in enumerate(SCENARIOS.items()):
            if device != "cpu" and (name not in ON_CUDA or (options.get("dtype") == "bfloat16"
                                                            and not bf16_on_cuda)):
                continue
            found[name if device == "cpu" else f"{name}@{device}"] = {
                "what": words + ("" if device == "cpu" else f" on {device}"), "device": device,
                "seed": salted_seed(i, salt), "n_batches": N_BATCHES, "dtype": None, "outlier_batch": None,
                "dropout": False, "eval_first": False, **options}
    return found
