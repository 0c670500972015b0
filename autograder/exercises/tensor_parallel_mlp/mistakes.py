"""The known mistakes of ``TensorParallelMLP`` and their fingerprints in the ranks' records (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/tensor_parallel_mlp.py
(tests/test_diagnosis.py). Each rank records its output, x.grad, its shards (value and gradient) and the collectives
of its forward and backward passes; the reference carries the single-process MLP's run (``single``). A count record
with another set of operations than the reference's does not parse, so these fingerprints read the raw records.
"""
from ..diagnosis import EVERY, Mistake, error_of, raw_scenario
from ..reading import DEADLOCK, close

ATOL = 1e-4


def _ranks(student, key="two_ranks") -> list[dict]:
    ranks = raw_scenario(student, key)["ranks"]
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
        raise KeyError(key)
    return ranks


def _single(reference, key="two_ranks") -> dict:
    return reference["single"][key]


def _count(rank: dict, phase: str) -> int:
    ops = rank.get(phase)
    return int(ops.get("all_reduce", 0)) if isinstance(ops, dict) else -1


def _counts(student, key="two_ranks") -> tuple[set, set]:
    ranks = _ranks(student, key)
    return {_count(r, "forward") for r in ranks}, {_count(r, "backward") for r in ranks}


def _output_right(student, reference, key="two_ranks") -> bool:
    return all(close(r["output"], _single(reference, key)["output"], atol=ATOL) for r in _ranks(student, key))


def _x_grad_right(student, reference, key="two_ranks") -> bool:
    return all(close(r["x_grad"], _single(reference, key)["x_grad"], atol=ATOL) for r in _ranks(student, key))


def _bias(reference, key="two_ranks") -> list[float]:
    return _single(reference, key)["shards"][0]["fc2.bias"]["value"]


def _n(reference, key="two_ranks") -> int:
    return reference["scenarios"][key]["case"]["world_size"]


def _outputs_like(student, reference, make) -> bool:
    """Every rank's output equals make(single output, fc2 bias repeated per row, n)."""
    single, bias, n = _single(reference)["output"], _bias(reference), _n(reference)
    bias_rows = [bias[i % len(bias)] for i in range(len(single))]
    want = make(single, bias_rows, n)
    return all(close(r["output"], want, atol=ATOL) for r in _ranks(student))


def all_reduce_in_f_and_g_forward(student, reference):
    forward, backward = _counts(student)
    if forward == {2} and backward == {0}:
        return "each rank's forward pass ran 2 all-reduces and its backward none"
    return None


def no_backward_all_reduce(student, reference):
    forward, backward = _counts(student)
    if forward == {1} and backward == {0} and _output_right(student, reference) and not _x_grad_right(student, reference):
        return "the output is right, but the backward pass ran no all-reduce and x.grad is only this rank's part"
    return None


def autograd_all_reduce_for_g(student, reference):
    forward, backward = _counts(student)
    if forward == {1} and backward == {2}:
        return "the backward pass ran 2 all-reduces: g's backward all-reduced the output gradient too"
    return None


def averages_instead_of_summing(student, reference):
    if _outputs_like(student, reference, lambda y, b, n: [(v - c) / n + c for v, c in zip(y, b)]) or \
            _outputs_like(student, reference, lambda y, b, n: [v / n for v in y]):
        return "each rank's output is the single-process output (without fc2's bias) divided by the number of ranks"
    return None


def fc2_bias_on_every_rank(student, reference):
    if _outputs_like(student, reference, lambda y, b, n: [v + (n - 1) * c for v, c in zip(y, b)]):
        return "each rank's output is the single-process output plus fc2's bias (number of ranks - 1) more times"
    return None


def _shard_rows_wrong(student, reference) -> bool:
    from .checks import check_shards  # the check's own reading of which slice each rank keeps

    return bool(check_shards({"salt": student["salt"], "scenarios": student["scenarios"]}, reference))


def interleaved_shards(student, reference):
    if _output_right(student, reference) and _x_grad_right(student, reference) and _shard_rows_wrong(student, reference):
        return "the output and x.grad are right, but rank 0 does not keep a contiguous block of fc1's rows"
    return None


def _no_collectives(student) -> bool:
    forward, backward = _counts(student)
    return forward == {0}


def unsplit_mlp_on_every_rank(student, reference):
    ranks = _ranks(student)
    if _no_collectives(student) and _output_right(student, reference) and not any(
            isinstance(r.get("shards"), dict) and r["shards"].get("fc1.weight") for r in ranks):
        return "every rank computed the whole MLP: no shards, no all-reduce, the full output"
    return None


def returns_this_ranks_partial_output(student, reference):
    ranks = _ranks(student)
    if _no_collectives(student) and not close(ranks[0]["output"], ranks[1]["output"], atol=ATOL):
        return "the forward pass ran no all-reduce, and the ranks returned different (partial) outputs"
    return None


def constant_output(student, reference):
    ranks = _ranks(student)
    if _no_collectives(student) and not _output_right(student, reference) and all(
            close(r["output"], ranks[0]["output"], atol=0.0) for r in ranks) and len(set(ranks[0]["output"])) <= 1:
        return "every rank returned the same constant output"
    return None


def parallelize_module(student, reference):
    if any(r.get("forbidden") is True for r in _ranks(student)):
        return "a rank used torch's tensor parallelism (parallelize_module, DTensor)"
    return None


def shards_the_wrong_dimension(student, reference):
    if "shapes cannot be multiplied" in error_of(student, "two_ranks"):
        return "the matrix product failed: the shard has the wrong shape"
    return None


def deadlocks_on_three_ranks(student, reference):
    if error_of(student, "three_ranks") == DEADLOCK and not error_of(student, "two_ranks"):
        return "on 2 ranks it ran; on 3 ranks a rank waited in a collective the others never called"
    return None


MISTAKES = [
    Mistake("all_reduce_in_f_and_g_forward", "You all-reduce in the forward pass of both f and g.",
            "f is the identity going forward (every rank already holds x) and all-reduces x's gradient going back.",
            "f: identity forward, all-reduce backward; g: all-reduce forward, identity backward.",
            all_reduce_in_f_and_g_forward),
    Mistake("no_backward_all_reduce", "Your backward pass sums nothing over the ranks (f has no all-reducing backward).",
            "Each rank's x.grad is only its shard's part; the input gradient is their sum.",
            "Write f as a torch.autograd.Function: identity forward, dist.all_reduce of the gradient in backward.",
            no_backward_all_reduce, variants=("missing_backward_all_reduce", "all_reduce_without_autograd")),
    Mistake("autograd_all_reduce_for_g", "g's backward all-reduces the gradient too (a differentiable all_reduce).",
            "dL/dy is already the same on every rank; summing it multiplies the shards' gradients by the world size.",
            "Give g an identity backward (a torch.autograd.Function).", autograd_all_reduce_for_g),
    Mistake("averages_instead_of_summing", "You average the partial outputs instead of summing them.",
            "Each rank's partial product is one term of the sum over hidden units: the output is their sum.",
            "Use the all-reduce's sum (ReduceOp.SUM), without dividing.", averages_instead_of_summing),
    Mistake("fc2_bias_on_every_rank", "Every rank adds fc2's bias before the all-reduce.",
            "The sum over ranks then adds the bias world_size times.",
            "Add fc2's bias once, after the all-reduce (or on one rank only).", fc2_bias_on_every_rank),
    Mistake("interleaved_shards", "Your ranks keep interleaved rows of fc1 (every N-th), not a contiguous block.",
            "The exercise's layout is rank r's block of h/N consecutive hidden units, the same in fc1's rows and "
            "fc2's columns.", "Slice rows r*h/N to (r+1)*h/N of fc1 and the same columns of fc2.",
            interleaved_shards),
    Mistake("unsplit_mlp_on_every_rank", "Every rank keeps and runs the whole MLP.",
            "That replicates the model: nothing is sharded, and each rank does all the work.",
            "Keep only this rank's block of fc1's rows and fc2's columns, and all-reduce the partial outputs.",
            unsplit_mlp_on_every_rank, includes=EVERY),
    Mistake("returns_this_ranks_partial_output", "You return this rank's partial output without the all-reduce (g).",
            "Each rank's product covers only its hidden units: the output is the sum over ranks.",
            "All-reduce (sum) the partial outputs in g's forward.", returns_this_ranks_partial_output),
    Mistake("constant_output", "Your forward pass returns a constant.", "Nothing in it uses the input or the shards.",
            "Compute the sharded MLP the docstring describes.", constant_output, includes=EVERY),
    Mistake("parallelize_module", "You use torch's tensor parallelism (parallelize_module / DTensor).",
            "This exercise asks you to write the sharding and the collectives yourself.",
            "Slice the weights yourself and write f and g as autograd Functions.", parallelize_module, includes=EVERY),
    Mistake("shards_the_wrong_dimension", "You shard fc1 by columns (input features) instead of rows.",
            "nn.Linear's weight is (out_features, in_features): column-parallel fc1 splits its rows.",
            "Keep rows r*h/N to (r+1)*h/N of fc1.weight (and of fc1.bias), the same columns of fc2.weight.",
            shards_the_wrong_dimension),
    Mistake("deadlocks_on_three_ranks", "Your code calls the collectives differently on some ranks when there are 3.",
            "A collective completes only when every rank calls it.",
            "Make every rank call the same collectives in the same order, whatever the world size.",
            deadlocks_on_three_ranks),
]
