"""The known mistakes of ``MiniFSDP`` and their fingerprints in the ranks' records (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/mini_fsdp.py (tests/exercises/test_diagnosis.py).
Each rank records its shard's size and dtypes, the losses and gradient norms, what it held between layers
(``between``: per step and layer, [layer, bytes held, layers gathered]), the bytes held after synchronisation and
its gathered full parameters; the reference carries FSDP2's run (``fsdp2``). Records of another shape than the
reference's do not parse, so these fingerprints read the raw records.
"""
import math

from ..judging.checking import ABORTED, DEADLOCK, close
from ..judging.diagnosis import EVERY, Mistake, error_of, raw_scenario
from ..judging.localise import RTOL, Locate
from .cases import BF16_RTOL


def _ranks(student, key="fp32_two") -> list[dict]:
    ranks = raw_scenario(student, key)["ranks"]
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
        raise KeyError(key)
    return ranks


def _ref_rank(reference, key="fp32_two") -> dict:
    return reference["scenarios"][key]["ranks"][0]


def _fsdp2(reference, key="fp32_two") -> dict:
    return reference["fsdp2"][key][0]


def _n(reference, key="fp32_two") -> int:
    return reference["scenarios"][key]["case"]["world_size"]


def calls_torch_fully_shard(student, reference):
    if any(r.get("forbidden") is True for r in _ranks(student)):
        return "a rank used torch's FSDP (fully_shard)"
    return None


def forgets_to_divide(student, reference):
    for key in ("fp32_two", "fp32_three"):
        got, want, n = _ranks(student, key)[0]["grad_norms"], _fsdp2(reference, key)["grad_norms"], _n(reference, key)
        if not close(got[:1], [n * want[0]], atol=1e-5, rtol=1e-4):
            return None
    return "at the first step the gradient norm is 2 × FSDP2's on 2 ranks and 3 × on 3 ranks"


def all_reduce_keeps_full_grads(student, reference):
    got, want = _ranks(student)[0]["after_sync"], _ref_rank(reference)["after_sync"]
    between_ok = _ranks(student)[0]["between"] == _ref_rank(reference)["between"]
    if between_ok and got and got[0] > want[0]:
        return f"after synchronisation rank 0 held {got[0]} bytes of gradients and shards, {want[0]} in the reference"
    return None


def never_frees_gathered(student, reference):
    between = _ranks(student)[0]["between"][0]
    if len(between) > 1 and len(between[-1][2]) > 1 and _ranks(student)[0]["shard_numel"] == _ref_rank(reference)["shard_numel"]:
        return (f"between layers rank 0 still held the gathered parameters of layers {between[-1][2]}, "
                "not only the layer it computes")
    return None


def keeps_gathered_layers_for_backward(student, reference):
    from .checks import SLACK_BYTES, memory_problem, shard_bytes

    budget = shard_bytes(reference["scenarios"]["fp32_two"]["case"]) + SLACK_BYTES
    between_steps_ok = all(held <= budget for r in _ranks(student) for held in r["after_step"])
    fp32_right = close(_ranks(student)[0]["grad_norms"], _fsdp2(reference)["grad_norms"], atol=1e-5, rtol=1e-4)
    if fp32_right and between_steps_ok and "more than the reference" in (memory_problem(student, reference) or ""):
        return ("between steps only the shards stay, but during backward each rank held several gathered layers "
                "more than the reference (measured from outside)")
    return None


def unsharded_wrapper(student, reference):
    got, want = _ranks(student)[0]["shard_numel"], _ref_rank(reference)["shard_numel"]
    if got >= _n(reference) * want - _n(reference):
        return f"rank 0 keeps {got} parameter elements between steps, the whole model, not a 1/{_n(reference)} shard"
    return None


def no_padding(student, reference):
    if error_of(student, "fp32_three") == ABORTED and not error_of(student, "fp32_two"):
        return "on 2 ranks it ran; on 3 ranks, with layer sizes not divisible by 3, gloo killed a rank over a message size"
    return None


def shards_columns_gathers_rows(student, reference):
    if error_of(student, "fp32_two") == ABORTED:
        return "on 2 ranks gloo killed a rank: the gathered pieces had other sizes than the receiving buffers"
    return None


def bf16_master_weights(student, reference):
    if "invalid tensor type" in error_of(student, "bf16_two") and not error_of(student, "fp32_two"):
        return "with param_dtype=bfloat16 a collective got tensors of another dtype than the others"
    return None


def computes_in_float32_with_bf16_weights(student, reference):
    rank = _ranks(student, "bf16_two")[0]
    want = _fsdp2(reference, "bf16_two")
    losses_close = close(rank["losses"], want["losses"], atol=1e-3)
    params = rank["full_params"]["0.weight"][1]
    off = max(abs(a - b) for a, b in zip(params, want["full_params"]["0.weight"]))
    fp32_right = close(_ranks(student)[0]["grad_norms"], _fsdp2(reference)["grad_norms"], atol=1e-5, rtol=1e-4)
    if fp32_right and losses_close and 1e-6 < off < 1e-2:
        return ("with param_dtype=bfloat16 the losses are close to FSDP2's but the trained parameters are slightly "
                "off: the layers did not compute in bfloat16")
    return None


def constant_output(student, reference):
    rank = _ranks(student)[0]
    if rank["shard_numel"] <= 1 and all(g == 0 for g in rank["grad_norms"]):
        return "the model has no parameters to train: every gradient norm is 0"
    return None


def answers_gates_in_advance(student, reference):
    from ..judging.checking import gate_problem

    memory = reference["scenarios"]["memory"]
    gates = len(memory["case"]["sizes"]) - 2
    for rank in range(memory["case"]["world_size"]):
        problem = gate_problem(student["scenarios"]["memory"]["meter"], rank, gates, memory["meter"])
        # the first pause comes before any seed: one reached with a wrong gradient there is a wrong forward
        if problem and (("asked early" in problem and "pause 1 of" not in problem) or "times where" in problem):
            return f"rank {rank} {problem}"
    return None


def deadlocks_rank_one(student, reference):
    if error_of(student, "fp32_two") == DEADLOCK:
        return "on 2 ranks a rank waited in a collective the other never called"
    return None


MISTAKES = [
    Mistake("calls_torch_fully_shard", "You use torch's FSDP (fully_shard).",
            "This exercise asks you to write the sharding, gathering and reduce-scattering yourself.",
            "Keep a flat shard per layer and all-gather / reduce-scatter it yourself.", calls_torch_fully_shard,
            includes=EVERY),
    Mistake("forgets_to_divide", "You reduce-scatter the gradients without dividing by the world size.",
            "reduce_scatter sums over ranks; FSDP averages, so every step is world_size times too large.",
            "Divide the gradient shard by the world size after the reduce-scatter.", forgets_to_divide),
    Mistake("all_reduce_keeps_full_grads", "You all-reduce the full gradients and keep them.",
            "FSDP keeps only each rank's gradient shard: full gradients on every rank cost the memory sharding saves.",
            "Reduce-scatter into the shard's gradient and drop the full ones.", all_reduce_keeps_full_grads),
    Mistake("never_frees_gathered", "You never free a layer's gathered parameters after its forward.",
            "Then all layers' full parameters are resident at once, as without FSDP.",
            "Free (or resize to 0) each layer's gathered parameters right after its forward, and re-gather for "
            "backward.", never_frees_gathered),
    Mistake("keeps_gathered_layers_for_backward", "You keep every layer's gathered parameters from its forward until "
            "its backward.", "Then all gathered layers are alive at the start of backward: the peak is the unsharded "
            "model's, which FSDP exists to avoid.", "Free each layer's gathered parameters right after its forward "
            "and gather them again (a backward pre-hook or saved-tensor hooks) when its backward needs them.",
            keeps_gathered_layers_for_backward,
            # these variants start from the same template, which keeps the gathered layers for backward too
            variants=("no_padding", "bf16_master_weights", "all_reduce_keeps_full_grads")),
    Mistake("answers_gates_in_advance", "Your code asks at the grader's pauses itself, ahead of the model's "
            "backward.", "The pauses measure what a rank holds at that point of its backward pass; a request made "
            "elsewhere measures nothing there.", "Leave the grader's pauses alone: call backward once and let the "
            "model's own backward reach each of them.", answers_gates_in_advance),
    Mistake("unsharded_wrapper", "Every rank keeps the whole model.", "Nothing is sharded: FSDP saves no memory.",
            "Keep only this rank's 1/N flat shard of each layer between steps.", unsharded_wrapper),
    Mistake("no_padding", "You split each layer's flat parameters without padding them to a multiple of the world "
            "size.", "When the size is not divisible, ranks get shards of different sizes and the collectives "
            "fail.", "Pad the flat tensor to a multiple of world_size before splitting; unpad after gathering.",
            no_padding),
    Mistake("shards_columns_gathers_rows", "You shard along one dimension and gather along another.",
            "The gathered pieces then do not fit the buffers the other ranks expect.",
            "Shard and gather the same flat (1-D) view of each layer.", shards_columns_gathers_rows),
    Mistake("bf16_master_weights", "You keep the shards (master weights) themselves in bfloat16.",
            "The master weights must stay float32; only the gathered copies for compute are bfloat16.",
            "Keep float32 shards; cast the gathered copy to param_dtype.", bf16_master_weights),
    Mistake("computes_in_float32_with_bf16_weights", "With param_dtype=bfloat16 your layers compute in float32.",
            "bfloat16 is meant for the compute too (inputs and gathered weights), as FSDP2's MixedPrecisionPolicy.",
            "Cast the gathered weights and the layer inputs to param_dtype for the forward.",
            computes_in_float32_with_bf16_weights),
    Mistake("constant_output", "Your wrapper does not run the model's layers.", "Nothing is trained.",
            "Gather each layer's parameters and run it in forward.", constant_output, includes=EVERY),
    Mistake("deadlocks_rank_one", "Your ranks do not all call the same collectives.",
            "A collective completes only when every rank calls it.",
            "Make every rank call the same collectives in the same order.", deadlocks_rank_one),
]


# What the observed values are called in the exercise, and the factors a plausible mistake scales them by.
def _chunk_spread(full: dict, layer: str, n: int) -> list[float]:
    """How far each shard r ≥ 1 of a layer's flat parameters (weight then bias, padded to N equal shards) is from
    shard 0, over the length they share."""
    flat = [float(v) for name in (f"{layer}.weight", f"{layer}.bias") for v in full[name][1]]
    size = -(-len(flat) // n)
    first = flat[:size]
    return [math.dist(flat[r * size:(r + 1) * size], first[:len(flat[r * size:(r + 1) * size])])
            for r in range(1, n) if flat[r * size:(r + 1) * size]]


def same_shard_everywhere(student, reference) -> str:
    """Every rank kept one and the same shard (rank 0's): in the trained parameters gather_full_params() returns,
    each layer's shard r is its shard 0 but for the training's small updates, where the right shards differ."""
    closest = 0.0
    for key, scenario in reference["scenarios"].items():
        ranks = scenario.get("ranks")
        if not ranks or "full_params" not in ranks[0]:
            continue
        n, want = scenario["case"]["world_size"], ranks[0]["full_params"]
        have = raw_scenario(student, key)["ranks"][0]["full_params"]
        for layer in sorted({name.rpartition(".")[0] for name in want}):
            mine, theirs = _chunk_spread(have, layer, n), _chunk_spread(want, layer, n)
            closest = max(closest, *(m / t for m, t in zip(mine, theirs) if t > 0))
    if 0 < closest < 0.25:
        return ("Every rank holds the same shard, rank 0's: in the parameters gather_full_params() returns, each "
                f"layer's shard of every other rank equals its shard 0 but for the training's updates (at most "
                f"{closest:.0%} of how far the right shards are apart), on every layer: each "
                "rank must keep its own shard r of the flat layer.")
    return ""


LOCATE = Locate(narrow=same_shard_everywhere,
                names={"losses": "the losses", "grad_norms": "the gradient norms", "full_params": "parameter {}",
                       "shard_numel": "the shard size", "shard_dtypes": "the shards' dtypes"},
                # the memory scenario's gradient norm is taken under the launcher's secret per-element gate factors,
                # different in every run: method evidence (the gates' digests), not a result to compare
                ignore=("between", "after_sync", "after_step", "forbidden", "grad_norm"),
                tolerance=lambda case: 2 * BF16_RTOL if case["param_dtype"] else RTOL,
                factors=lambda case: {"world_size": case["world_size"]})
