"""The known mistakes of ``TensorParallelMLP`` and their fingerprints in the ranks' records (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/tensor_parallel_mlp.py
(tests/exercises/test_diagnosis.py). Each rank records its output, x.grad, its shards (value and gradient) and the collectives
of its forward and backward passes ([kind, count] pairs); the reference carries the single-process MLP's run
(``single``). A count record with another set of operations than the reference's does not parse, so these
fingerprints read the raw records. Each rank's layers are true only in its own block of hidden units (the others
are poisoned, per rank), so a rank that computes with rows outside its block gets wrong values. The ``traffic``
scenario's bytes per pass (measured outside the ranks) are read only where they were measured on a loopback of the
ranks' own (``checking.measured_privately``).
"""
import math

from ..judging.checking import DEADLOCK, close, measured_privately
from ..judging.diagnosis import EVERY, Mistake, error_of, raw_scenario
from ..judging.localise import Locate
from .cases import ROLES, SEEDED_X_GRAD, TRAFFIC_RATIO

ATOL = 1e-4


def _ranks(student, key="two_ranks") -> list[dict]:
    ranks = raw_scenario(student, key)["ranks"]
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
        raise KeyError(key)
    return ranks


def _single(reference, key="two_ranks") -> dict:
    return reference["single"][key]


def _kinds(rank: dict, phase: str) -> dict[str, int]:
    """The pass's collectives by kind, from the rank's [kind, count] pairs (KeyError when they are not pairs)."""
    pairs = rank[phase]
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise KeyError(phase)
    return {str(kind): int(count) for kind, count in pairs}


def _count(rank: dict, phase: str) -> int:
    return _kinds(rank, phase).get("all_reduce", 0)


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


def _true_fc1_rows(reference, key="two_ranks") -> list[list[float]]:
    """The rows of the true (single-process) fc1.weight, from every rank's block of it."""
    d_in = reference["scenarios"][key]["case"]["d_in"]
    flat = [v for shard in _single(reference, key)["shards"] for v in shard["fc1.weight"]["value"]]
    return [flat[i:i + d_in] for i in range(0, len(flat), d_in)]


def interleaved_shards(student, reference):
    """Rank 0's fc1.weight shard holds rows 0, N, 2N, ... of the layer: those inside its own block are true (the
    rest are the poisoned rows of other blocks, which is why the values are wrong)."""
    c, n = reference["scenarios"]["two_ranks"]["case"], _n(reference)
    rows, shard = _true_fc1_rows(reference), _ranks(student)[0]["shards"]["fc1.weight"]["value"]
    mine = [shard[i:i + c["d_in"]] for i in range(0, len(shard), c["d_in"])]
    every_nth = [j for j in range(1, len(mine)) if j * n < c["per_rank"]]  # rows j·N inside rank 0's own block
    if every_nth and _shard_rows_wrong(student, reference) and all(
            close(mine[j], rows[j * n], atol=0.0) for j in every_nth):
        return (f"rank 0's fc1.weight shard holds rows {', '.join(str(j * n) for j in [0, *every_nth])}, … of the "
                f"layer (one row in every {n}), not a contiguous block; rows outside a rank's own block hold other values "
                "on that rank, so the outputs and gradients are wrong")
    return None


def _no_collectives(student) -> bool:
    forward, backward = _counts(student)
    return forward == {0}


def _has_shards(rank: dict) -> bool:
    return isinstance(rank.get("shards"), dict) and bool(rank["shards"].get("fc1.weight"))


def unsplit_mlp_on_every_rank(student, reference):
    ranks = _ranks(student)
    if _counts(student) == ({0}, {0}) and not any(_has_shards(r) for r in ranks) and \
            len(set(ranks[0]["output"])) > 1 and not _output_right(student, reference):
        return ("no rank ran a collective or kept a parameter shaped like its shard, and the outputs are wrong: each "
                "rank ran the whole MLP on the layers it was given, of which only its own block holds the true values")
    return None


def returns_this_ranks_partial_output(student, reference):
    ranks = _ranks(student)
    if _no_collectives(student) and all(_has_shards(r) for r in ranks) and \
            not close(ranks[0]["output"], ranks[1]["output"], atol=ATOL):
        return "the forward pass ran no all-reduce, and the ranks returned different (partial) outputs"
    return None


def constant_output(student, reference):
    ranks = _ranks(student)
    if _no_collectives(student) and not _output_right(student, reference) and all(
            close(r["output"], ranks[0]["output"], atol=0.0) for r in ranks) and len(set(ranks[0]["output"])) <= 1:
        return "every rank returned the same constant output"
    return None


def _byte_ratios(student, reference) -> dict[str, float] | None:
    """The traffic scenario's bytes of each pass as a multiple of the reference's, or None where they were not
    measured on a loopback of the ranks' own (then bytes say nothing)."""
    from .checks import pass_bytes

    c = reference["scenarios"]["traffic"]["case"]
    got, want = raw_scenario(student, "traffic").get("meter"), reference["scenarios"]["traffic"]["meter"]
    if not measured_privately(got, want):  # also where the scenario failed: no meter
        return None
    mine, theirs = pass_bytes(got, c), pass_bytes(want, c)
    return {phase: mine[phase] / theirs[phase] for phase in mine} if mine and theirs else None


def _bytes_words(ratios: dict[str, float] | None, phase: str) -> str:
    if ratios is None:
        return ""
    return f"; your ranks sent {ratios[phase]:.2g} times the reference's bytes in the {phase} pass (measured outside your ranks)"


def token_all_reduces(student, reference):
    """One all-reduce in each pass, yet the ranks' outputs differ: what was all-reduced was not the output."""
    ranks, ratios = _ranks(student), _byte_ratios(student, reference)
    if _counts(student) == ({1}, {1}) and not _output_right(student, reference) and any(
            not close(r["output"], ranks[0]["output"], atol=ATOL) for r in ranks) and (
            ratios is None or ratios["forward"] < 1 / TRAFFIC_RATIO):
        return ("each pass ran one all-reduce, yet the ranks returned different, wrong outputs: the all-reduce did not "
                f"carry the partial outputs{_bytes_words(ratios, 'forward')}")
    return None


def _gathers(student, phase: str) -> int:
    """Rank 0's all-gathers in the pass."""
    return _kinds(_ranks(student)[0], phase).get("all_gather", 0)


def gathers_the_hidden_activations(student, reference):
    ratios = _byte_ratios(student, reference)
    if not (_output_right(student, reference) and _x_grad_right(student, reference)) or _counts(student)[1] != {1}:
        return None
    if _gathers(student, "forward"):
        return ("the output and x.grad are right and the backward ran f's all-reduce, but the forward pass ran "
                f"all_gather × {_gathers(student, 'forward')} instead of one all-reduce{_bytes_words(ratios, 'forward')}")
    if ratios is not None and ratios["forward"] > TRAFFIC_RATIO:
        return (f"the output and x.grad are right, but the forward pass sent {ratios['forward']:.2g} times the "
                "reference's bytes (measured outside your ranks), whatever your ranks' own record says")
    return None


def gathers_the_weights(student, reference):
    ratios = _byte_ratios(student, reference)
    if _output_right(student, reference) and _x_grad_right(student, reference) and _counts(student)[1] == {0} and \
            not any(_kinds(r, "backward") for r in _ranks(student)) and (
            _gathers(student, "forward") or (ratios is not None and ratios["forward"] > TRAFFIC_RATIO)):
        return ("x.grad is right on every rank although the backward pass ran no collective at all: each rank computed "
                f"the whole input gradient itself, from whole weights gathered in the forward pass"
                f"{_bytes_words(ratios, 'forward')}")
    return None


def answers_gates_in_advance(student, reference):
    """The traffic scenario's pause between the passes asked at the rank's own moment: another number of times than
    once, or x.grad summed before the pause was answered (the upstream gradient it draws came later), where the
    scenarios without a pause get x.grad right."""
    from .checks import fingerprint_problem, pause_problem

    meter = raw_scenario(student, "traffic").get("meter")
    want = reference["scenarios"]["traffic"]
    for rank in range(want["case"]["world_size"]):
        problem = pause_problem(meter, rank, reference) if isinstance(meter, dict) else None
        if problem and "times where" in problem:
            return f"rank {rank} {problem}"
    if _output_right(student, reference) and _x_grad_right(student, reference) and \
            fingerprint_problem(raw_scenario(student, "traffic"), want, "output") is None and \
            fingerprint_problem(raw_scenario(student, "traffic"), want, "x_grad"):
        return ("x.grad is right where the grader does not pause, and wrong where its pause between the passes draws "
                "the upstream gradient: your ranks computed or summed x.grad before that pause was answered")
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
            "Add fc2's bias once, after the all-reduce, on every rank (each keeps all of fc2.bias and its gradient).",
            fc2_bias_on_every_rank),
    Mistake("interleaved_shards", "Your ranks keep interleaved rows of fc1 (every N-th), not a contiguous block.",
            "The exercise's layout is rank r's block of h/N consecutive hidden units, the same in fc1's rows and "
            "fc2's columns.", "Slice rows r*h/N to (r+1)*h/N of fc1 and the same columns of fc2.",
            interleaved_shards),
    Mistake("unsplit_mlp_on_every_rank", "Every rank keeps and runs the whole MLP.",
            "That replicates the model: nothing is sharded, and each rank does all the work.",
            "Keep only this rank's block of fc1's rows and fc2's columns, and all-reduce the partial outputs.",
            unsplit_mlp_on_every_rank, includes=EVERY),
    Mistake("full_mlp_with_shard_parameters_and_token_all_reduces",
            "Each rank runs the whole MLP itself and all-reduces something other than the partial outputs.",
            "A rank's layers are only its block of the model: the output is the sum over ranks of each block's partial "
            "output, and an all-reduce that does not carry it leaves every rank with its own wrong answer.",
            "Compute only with your shards, and let g all-reduce the (batch, d_out) partial outputs and f the input "
            "gradient.", token_all_reduces),
    Mistake("all_gathers_the_hidden_activations",
            "Your forward pass gathers the hidden activations (and fc2's columns) instead of all-reducing the partial "
            "outputs.", "A gather sends the (batch, h) activations, about h / (2·d_out) times the bytes of Megatron's one "
            "all-reduce of the (batch, d_out) partial outputs: the traffic tensor parallelism is designed to avoid.",
            "Multiply your activations by your own columns of fc2 and sum the partial outputs with one all-reduce (g).",
            gathers_the_hidden_activations, variants=("all_gather_with_a_forged_count",)),
    Mistake("gathers_the_weights", "You gather the weights and run the whole MLP on every rank.",
            "That rebuilds the unsplit model on every rank: each rank holds all the weights and does all the work, "
            "which is what tensor parallelism splits.",
            "Compute with your own shards only: f before fc1 (all-reduce of x's gradient), g after fc2 (all-reduce of "
            "the partial outputs).", gathers_the_weights),
    Mistake("answers_gates_in_advance", "Your code stops at the grader's pause between the passes itself, at a "
            "moment of its choosing, or computes x's gradient before backward().",
            "The pause splits the forward's bytes from the backward's, and its answer draws the upstream gradient: an "
            "input gradient summed before it is the wrong one.",
            "Never call the grader's gates yourself; sum x.grad in f's backward, which runs in backward().",
            answers_gates_in_advance),
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


ACTIVATIONS = {"GELU": lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))), "ReLU": lambda v: max(v, 0.0)}


def _rights(student, reference, role: str, part: str) -> set[bool]:
    """Whether each rank's shard of ``role`` (its "value" or "grad") is right, over the scenarios with shards."""
    found = set()
    for key in ("two_ranks", "three_ranks"):
        single = _single(reference, key)["shards"]
        for rank, record in enumerate(_ranks(student, key)):
            shard = record["shards"][role] if isinstance(record.get("shards"), dict) else None
            have = shard.get(part) if isinstance(shard, dict) else None
            found.add(close(have, single[rank][role][part], atol=ATOL) if isinstance(have, list) else False)
    return found


def which_half(student, reference) -> str:
    """Which half of the MLP a wrong output comes from, by what the observation holds: an output that is an
    activation of the right one (applied after fc2 too), or the gradient at fc2's bias (right: nothing after the bias
    changes the output's gradient) against fc2.weight's (its input, the hidden activation, times that gradient)."""
    if _output_right(student, reference) and _output_right(student, reference, "three_ranks"):
        return ""
    for name, act in ACTIVATIONS.items():
        if all(close(r["output"], [act(v) for v in _single(reference, key)["output"]], atol=ATOL)
               for key in ("two_ranks", "three_ranks") for r in _ranks(student, key)):
            return (f"Every rank's output is {name} of the right output, element by element: an activation is applied "
                    "after fc2 (after the sum over ranks and fc2's bias) as well; the MLP's activation goes between "
                    "fc1 and fc2 only.")
    if {role: _rights(student, reference, role, "value") for role in ROLES} != {role: {True} for role in ROLES}:
        return ""
    bias, weight = _rights(student, reference, "fc2.bias", "grad"), _rights(student, reference, "fc2.weight", "grad")
    if bias == {True} and weight == {False}:
        return ("Your shards hold the right values, and fc2.bias's gradient is right: the gradient reaching the "
                "output is right, and nothing after fc2's bias changes it. fc2.weight's gradient (the gradient at fc2's "
                "output times what enters fc2) is wrong on every rank: the hidden activation entering fc2 — fc1's "
                "output, its bias and the activation (GELU) — is wrong, or an operation between fc2's product and "
                "the sum over ranks changes the partial output.")
    if bias == {False}:
        return ("Your shards hold the right values, but fc2.bias's gradient is wrong: the gradient reaching fc2's bias "
                "differs, so an operation after fc2 (after its bias, or after the sum over ranks) changes the output.")
    return ""


# What the observed values are called in the exercise, and the factors a plausible mistake scales them by.
LOCATE = Locate(names={"output": "the output", "x_grad": "x's gradient", "shards": "{}", "value": "(value)",
                       "grad": "(gradient)"},
                # the traffic scenario's x.grad is taken under the launcher's secret seed at its gate, another in
                # every run: its truth is the launcher's recomputation (checks.fingerprint_problem), not the reference's
                ignore=("forward", "backward", "forbidden", SEEDED_X_GRAD),
                factors=lambda case: {"world_size": case["world_size"]},
                rows={"output": lambda case: (case["batch"], case["d_out"], "row of the batch"),
                      "x_grad": lambda case: (case["batch"], case["d_in"], "row of the batch")},
                narrow=which_half)
