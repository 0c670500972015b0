"""The scenarios of ``BucketedDDP`` and the sizes of its model (plain Python)."""
from ..scenarios import salted_seed

VOCAB, HIDDEN, EXTRA = 10, 8, 4     # token model: Embedding(VOCAB, HIDDEN) → 2 × Linear(HIDDEN, HIDDEN) → VOCAB
BATCH, STEPS = 6, 3                 # per-rank batch of tokens, optimizer steps
LR, MOMENTUM = 0.1, 0.9
MODEL_SEED, DATA_SEED = 4321, 77    # the public scenarios' seeds (salt 0)
GRAD_ATOL, PARAM_ATOL = 1e-6, 1e-5  # float32 round-off between valid styles (divide before or after, flat or not)
MIB = 1024 * 1024
ONE_BUCKET_MB = 1.0                 # the whole model is about 1 KiB: one bucket
PER_PARAM_MB = 1e-6                 # about 1 byte: smaller than any parameter, so one bucket per parameter
MID_MB = 288 / MIB                  # one Linear(8, 8) layer's weight and bias: several buckets of 1–2 parameters
# The overlap scenario: a stack of Linear(WIDTH, WIDTH) layers, the grader's gates between them, a bucket a layer.
WIDTH, LAYERS, OVERLAP_BATCH = 512, 6, 32
LAYER_BYTES = (WIDTH * WIDTH + WIDTH) * 4
LAYER_MB = LAYER_BYTES / MIB
HOLD = 1                            # the gate (backward order) at which the grader holds every rank but rank 0
# Bytes the overlap scenario may send beyond the reference's, in buckets (a bucket's all-reduce sends bucket_bytes
# while rank 0 is held). Every byte there is the method's own: the ranks start from different weights, so __init__
# must broadcast; full-precision gradients, so each bucket's all-reduce is needed once. Anything sent for show while
# rank 0 is held must be at least a bucket, more than this spare (correct styles: within 0.1 bucket of the
# reference under load 11; the loopback counts some tens of KiB more or less from run to run).
SPARE_BUCKETS = 0.5
# The overlap scenario's averaged gradients, projected (observing.projections): within this times their norm of the
# launcher's own float32 average. float32 round-off moves a projection by about 1e-7 of the norm, 16-bit all-reduces
# (bfloat16 or float16) by 1e-4 to 1e-3.
GRAD_PRECISION = 1e-5

SCENARIOS = {  # name: (world size, bucket MiB, model kind, ranks start from different weights?, what it is)
    "one_bucket": (2, ONE_BUCKET_MB, "plain", False, "called on 2 ranks with a bucket larger than the model"),
    "per_param": (2, PER_PARAM_MB, "plain", False,
                  "called on 2 ranks with a bucket smaller than any parameter (one bucket per parameter)"),
    "mid": (2, MID_MB, "plain", False, "called on 2 ranks with buckets of one or two parameters"),
    "three_ranks": (3, MID_MB, "plain", True, "called on 3 ranks that start from different weights"),
    "special": (2, MID_MB, "special", False,
                "the model has a frozen bias, an unused layer and tied weights (2 ranks)"),
    "overlap": (2, LAYER_MB, "gated", True,
                f"{LAYERS} layers of {WIDTH}×{WIDTH} run on 2 ranks that start from different weights, with a bucket "
                "per layer, the grader pausing each rank's backward between layers"),
}


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs; the seeds are public for salt 0 and held out for any other salt."""
    return {name: {"what": text, "world_size": world_size, "bucket_size_mb": bucket_mb, "model": kind,
                   "different_init": different, "steps": 1 if kind == "gated" else STEPS,
                   "model_seed": salted_seed(MODEL_SEED, salt), "data_seed": salted_seed(DATA_SEED, salt)}
            for name, (world_size, bucket_mb, kind, different, text) in SCENARIOS.items()}
