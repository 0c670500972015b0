"""The checks of ``MiniFSDP``: plain Python on the observations (no torch here)."""
import math

from ..judging.checking import case, close, gate_problem, rank_results
from .cases import BF16_RTOL, EXTRA_LAYERS, FP32_RTOL, LAYER_BYTES, PARAM_ATOL, SLACK_BYTES, layer_numels

TORCH_FSDP = ("Your wrapper uses torch's own FSDP (fully_shard or FullyShardedDataParallel): this exercise asks you to "
              "write the gathering and reduce-scattering yourself.")


def ranks_of(student: dict, reference: dict, key: str) -> list[dict]:
    return rank_results(student, reference, key, forbidden=TORCH_FSDP)


def shard_bytes(c: dict) -> int:
    """What every rank must keep: its fp32 shard of each flat, padded layer."""
    return sum(4 * math.ceil(n / c["world_size"]) for n in layer_numels(c))


def matches_fsdp2(student, reference, key: str, rtol: float) -> str | None:
    c, want = case(reference, key), reference["fsdp2"][key]
    for rank, (got, ref) in enumerate(zip(ranks_of(student, reference, key), want)):
        for step in range(c["steps"]):
            if not close(got["losses"][step:step + 1], ref["losses"][step:step + 1], atol=1e-7, rtol=rtol):
                return (f"When {c['what']}, rank {rank}'s loss at step {step + 1} differs from FSDP2's: "
                        + ("gather every layer's full parameters before it runs (in the right order, without the "
                           "padding)." if step == 0 else "the update of the step before was wrong."))
            got_norm, ref_norm = got["grad_norms"][step], ref["grad_norms"][step]
            if not close([got_norm], [ref_norm], atol=1e-7, rtol=rtol):
                n = c["world_size"]
                if ref_norm and abs(got_norm / ref_norm - n) < 0.05 * n:
                    return (f"When {c['what']}, the gradient norm at step {step + 1} is {n}× FSDP2's: "
                            "reduce-scatter sums, so divide by the world size.")
                return (f"When {c['what']}, the gradient norm at step {step + 1} differs from FSDP2's: each shard's "
                        ".grad must hold the average over ranks of that shard of the full gradient.")
    return None


def check_fp32_two(student, reference):
    return matches_fsdp2(student, reference, "fp32_two", FP32_RTOL)


def check_fp32_three(student, reference):
    problem = matches_fsdp2(student, reference, "fp32_three", FP32_RTOL)
    if problem:
        return problem
    return check_full_params(student, reference, "fp32_three", PARAM_ATOL)


def check_full_params(student, reference, key: str = "fp32_two", atol: float = PARAM_ATOL):
    c, want = case(reference, key), reference["fsdp2"][key][0]["full_params"]
    trained_apart = matches_fsdp2(student, reference, key, FP32_RTOL if key.startswith("fp32") else BF16_RTOL)
    for rank, got in enumerate(ranks_of(student, reference, key)):
        full = got["full_params"]
        if sorted(full) != sorted(want):
            return (f"When {c['what']}, gather_full_params() on rank {rank} does not return the model's state dict "
                    "names (e.g. '0.weight') with one full tensor each.")
        for name, (dtype, values) in full.items():
            if dtype != "torch.float32":
                return f"gather_full_params() returned {name} as {dtype}: return float32 tensors."
            if not close(values, want[name], atol=atol):
                if trained_apart:  # the training itself went wrong: say that, not "unpad"
                    return (f"When {c['what']}, the parameters after {c['steps']} steps differ from FSDP2's because "
                            "the training did (see the loss and gradient-norm checks).")
                return (f"When {c['what']}, rank {rank}'s {name} from gather_full_params() after {c['steps']} steps "
                        "differs from FSDP2's trained parameter: unpad and reshape every layer's gathered shards.")
    return None


def check_bf16(student, reference):
    return matches_fsdp2(student, reference, "bf16_two", BF16_RTOL)


def check_fp32_master(student, reference):
    ranks = ranks_of(student, reference, "bf16_two")
    if any(r["shard_dtypes"] != ["torch.float32"] for r in ranks):
        return ("With param_dtype=torch.bfloat16 your optimizer's parameters (the shards) are not float32: keep "
                "float32 master shards and cast a copy to param_dtype just before the all-gather.")
    return check_full_params(student, reference, "bf16_two", PARAM_ATOL)


def check_keeps_shard(student, reference):
    c = case(reference, "fp32_two")
    budget = shard_bytes(c) + SLACK_BYTES
    for rank, r in enumerate(ranks_of(student, reference, "fp32_two")):
        if r["shard_numel"] * 4 > budget:
            return (f"Rank {rank}'s trainable parameters are larger than one shard per layer: after __init__ keep "
                    "only this rank's slice of each flat, padded layer (drop the full parameters).")
        for step, held in enumerate(r["after_step"]):
            if held > budget:
                return (f"Between steps rank {rank} still holds more than its shards (step {step + 1}): keep only "
                        "this rank's slice of each flat, padded layer, and drop the gathered tensors.")
    # read in the rank, so believed only where the memory measured from outside agrees
    return memory_problem(student, reference, last_pause=True)


MIB = 1 << 20


def memory_problem(student, reference, *, last_pause: bool = False) -> str | None:
    """What each rank held at the grader's pauses in its backward pass, measured from outside it (meter.py,
    SampleAtGates): within EXTRA_LAYERS full layers of the reference's, and with the gradients arriving at the
    pauses the model's own under the launcher's seeds (the evidence that the rank's own backward reached each pause,
    after the one before it was answered: checking.gate_problem). ``last_pause``: only the
    last pause, where one layer's backward is left and a wrapper that keeps just its shards holds little either way."""
    key = "memory"
    c = case(reference, key)
    ranks_of(student, reference, key)
    meter, theirs = student["scenarios"][key]["meter"], reference["scenarios"][key]["meter"]
    for rank in range(c["world_size"]):
        problem = gate_problem(meter, rank, len(c["sizes"]) - 2, theirs)
        if problem:
            return (f"When {c['what']}, rank {rank} {problem}: call backward once, and let only the model's own "
                    "backward reach the pauses (they measure what a rank holds there).")
        held = [r["held_bytes"] or 0 for r in meter["gates"]["records"] if r["rank"] == rank]
        allowed = [r["held_bytes"] or 0 for r in theirs["gates"]["records"] if r["rank"] == rank]
        if last_pause:
            held, allowed = held[-1:], allowed[-1:]
        extra = max(held, default=0) - max(allowed, default=0)
        if extra > EXTRA_LAYERS * LAYER_BYTES:
            where = "at the last pause in backward" if last_pause else "at a pause in backward"
            return (f"When {c['what']}, rank {rank} held {extra / MIB:.0f} MiB more than the reference {where}, about "
                    f"{extra / LAYER_BYTES:.0f} full layers: free each layer's gathered parameters right after its "
                    "forward and gather them again when its backward needs them, keeping only this rank's shards in "
                    "between.")
    return None


def check_frees_layers(student, reference):
    return memory_problem(student, reference)


def check_grad_shards(student, reference):
    c = case(reference, "fp32_two")
    budget = 2 * shard_bytes(c) + shard_bytes(c) // 2 + SLACK_BYTES
    for rank, r in enumerate(ranks_of(student, reference, "fp32_two")):
        for step, held in enumerate(r["after_sync"]):
            if held > budget:
                return (f"After finish_gradient_synchronization() at step {step + 1}, rank {rank} still holds "
                        "full-size gradients: reduce-scatter so that each rank keeps only its shard's gradient, and "
                        "drop the full ones.")
    return None


def trained_for_real(got: dict, want: dict) -> str | None:
    """The evidence: every rank's first loss is FSDP2's on the seeded problem (only a forward through the
    gathered parameters gives it) and its first gradient norm is non-zero (gradients reached the shards)."""
    ranks = got.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != len(want["ranks"]):
        return f"when {want['case']['what']}, the grader got no result from every rank."
    for r, w in zip(ranks, want["ranks"]):
        if r.get("forbidden") or not close(r["losses"][:1], w["losses"][:1], atol=1e-7, rtol=BF16_RTOL) \
                or not r["grad_norms"][0] > 0:
            return f"when {want['case']['what']}, your wrapper did not train the grader's model."
    return None
