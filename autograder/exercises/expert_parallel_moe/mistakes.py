"""The known mistakes of ``ExpertParallelMoE`` and their fingerprints in the ranks' records (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/expert_parallel_moe.py
(tests/exercises/test_diagnosis.py). Each rank records its output, x.grad, its experts' and the router's gradients and the
collectives of its forward and backward passes ([operation, elements]); the reference carries the dense MoE's run
(``dense``: also its output without the gate and with rows left sorted by expert). The ``traffic`` scenario's bytes
(measured outside the ranks) are read only where they were measured on a loopback of the ranks' own.
"""
from ..judging.checking import ABORTED, DEADLOCK, close, sent_too_much
from ..judging.diagnosis import EVERY, Mistake, error_of, raw_scenario
from ..judging.localise import Locate
from .cases import TRAFFIC_RATIO
from .checks import ATOL, RTOL, same_rows

KEY = "two_ranks"


def _ranks(student, key=KEY) -> list[dict]:
    ranks = raw_scenario(student, key)["ranks"]
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
        raise KeyError(key)
    return ranks


def _dense(reference, key=KEY) -> dict:
    return reference["dense"][key]


def _ops(student, phase, key=KEY) -> list[str]:
    return [str(op[0]) for op in _ranks(student, key)[0][phase] if isinstance(op, list) and op]


def _outputs(student, reference, name) -> bool:
    return all(close(r["output"], _dense(reference)[name][i], atol=ATOL, rtol=RTOL) for i, r in enumerate(_ranks(student)))


def _output_right(student, reference) -> bool:
    return _outputs(student, reference, "output")


def _too_many_bytes(student, reference) -> float | None:
    """The traffic scenario's bytes as a multiple of the reference's, when above TRAFFIC_RATIO and measured on a
    loopback of the ranks' own; else None."""
    meter = raw_scenario(student, "traffic").get("meter")  # none where the scenario failed
    return sent_too_much(meter, reference["scenarios"]["traffic"]["meter"], TRAFFIC_RATIO) if isinstance(meter, dict) \
        else None


def all_gathers_the_tokens(student, reference):
    if not _output_right(student, reference):
        return None
    ops, ratio = set(_ops(student, "forward")), _too_many_bytes(student, reference)
    sent = f"; your ranks sent {ratio:.2g} times the reference's bytes (measured outside your ranks)" if ratio else ""
    if ops and "all_to_all" not in ops:
        return f"the output is right, but the forward pass moved tokens with {', '.join(sorted(ops))}, no all-to-all{sent}"
    if ratio:  # the ranks' own record may say all-to-all: the bytes, read outside them, say otherwise
        return (f"the output is right, and the record in your ranks shows all-to-alls, but your ranks sent {ratio:.2g} "
                "times the reference's bytes (measured outside your ranks): about what gathering every token on every "
                "rank sends")
    return None


def assumes_it_receives_what_it_sends(student, reference):
    if error_of(student, "three_ranks_skewed") == ABORTED and _output_right(student, reference):
        return ("with even routing it ran; with skewed routing gloo killed a rank in an all-to-all whose split sizes "
                "did not match")
    return None


def skips_experts_without_rows(student, reference):
    if error_of(student, "three_ranks_skewed") == DEADLOCK and _output_right(student, reference):
        return "with even routing it ran; when a rank's experts got no tokens, the ranks waited for each other"
    return None


def computes_every_expert_locally(student, reference):
    if not _ops(student, "forward") and not _output_right(student, reference) and all(
            r.get("router_grad") is not None for r in _ranks(student)):
        return "the forward pass ran no collective at all: every token stayed on its rank"
    return None


def returns_x(student, reference):
    if not _ops(student, "forward") and all(r.get("router_grad") is None for r in _ranks(student)):
        return "no collective ran, and the router got no gradient: the input came back unchanged"
    return None


def dispatch_outside_autograd(student, reference):
    if _output_right(student, reference) and "all_to_all" in _ops(student, "forward") and not _ops(student, "backward"):
        return "the output is right, but the backward pass ran no all-to-all: the gradients never went back"
    return None


def global_expert_id_as_local_index(student, reference):
    if "IndexError" in error_of(student, KEY) and "out of range" in error_of(student, KEY):
        return "indexing your own experts raised IndexError: an expert's global id was used as the local index"
    return None


def list_all_to_all_without_padding(student, reference):
    if "alltoall: invalid tensor size" in error_of(student, KEY):
        return "gloo's all_to_all refused tensors of different sizes"
    return None


def local_index_into_the_full_list(student, reference):
    if _ops(student, "forward").count("all_to_all") >= 2 and _ops(student, "backward") \
            and not _output_right(student, reference) and not _outputs(student, reference, "ungated") \
            and not _outputs(student, reference, "unsorted") and not any(
            same_rows(r["output"], _dense(reference)["output"][i], reference["scenarios"][KEY]["case"]["d"])
            for i, r in enumerate(_ranks(student))):
        return "tokens travelled by all-to-all both ways, but they were run through other experts than their own"
    return None


def no_gate(student, reference):
    if _outputs(student, reference, "ungated"):
        return "every rank's output is the experts' output without the gate"
    return None


def not_unpermuted(student, reference):
    d = reference["scenarios"][KEY]["case"]["d"]
    if not _output_right(student, reference) and (_outputs(student, reference, "unsorted") or all(
            same_rows(r["output"], _dense(reference)["output"][i], d) for i, r in enumerate(_ranks(student)))):
        return "every rank's output holds the right rows, in the order sorted by expert"
    return None


MISTAKES = [
    Mistake("all_gathers_the_tokens", "You move the tokens with all_gather / all_reduce instead of all-to-all.",
            "Gathering sends every token to every rank: N times the traffic and memory of expert parallelism.",
            "Send each token only to its expert's rank with all_to_all_single, and back the same way.",
            all_gathers_the_tokens, variants=("all_gather_and_reduce_scatter", "all_gather_with_a_forged_record")),
    Mistake("assumes_it_receives_what_it_sends", "You size the receive buffers as if each rank received what it "
            "sends.", "With uneven routing the counts differ per pair of ranks.",
            "Exchange the split sizes first (an all-to-all of the counts), then size the buffers from them.",
            assumes_it_receives_what_it_sends),
    Mistake("skips_experts_without_rows", "A rank whose experts got no tokens skips the exchange.",
            "All-to-all is a collective: every rank must call it, even with zero rows.",
            "Always call both all-to-alls, with zero-size splits where there are no tokens.", skips_experts_without_rows),
    Mistake("computes_every_expert_locally", "Each rank runs its tokens through local copies of every expert.",
            "The experts live on their owners: a rank holds only E/N of them, and the tokens must travel.",
            "Dispatch each token to its expert's rank with all-to-all, run it there, and combine.",
            computes_every_expert_locally),
    Mistake("returns_x", "Your forward returns its input.", "Nothing in it routes tokens or runs experts.",
            "Route, dispatch, run the experts, combine and gate, as the docstring says.", returns_x, includes=EVERY),
    Mistake("dispatch_outside_autograd", "Your all-to-alls are not autograd functions.",
            "The forward is right, but no gradient flows back to the tokens' ranks: x.grad and the experts' grads are "
            "wrong.", "Wrap dispatch and combine in torch.autograd.Function whose backward is the reverse all-to-all.",
            dispatch_outside_autograd),
    Mistake("global_expert_id_as_local_index", "You index your own experts with the global expert id.",
            "Rank r holds experts r·E/N to (r+1)·E/N − 1 as its 0th, 1st, … expert.",
            "Use e − r·E/N as the index into your own experts.", global_expert_id_as_local_index),
    Mistake("list_all_to_all_without_padding", "You use the list form of all_to_all with tensors of different sizes.",
            "gloo's list all_to_all needs equal sizes.",
            "Use all_to_all_single with input/output split sizes (or pad to equal sizes).",
            list_all_to_all_without_padding),
    Mistake("local_index_into_the_full_list", "You index the full list of experts with the local expert index.",
            "Rank r's j-th expert is the global expert r·E/N + j; experts[j] is another rank's expert.",
            "Use your own experts (the ones the rank was given) with the local index.",
            local_index_into_the_full_list),
    Mistake("no_gate", "You never multiply the experts' output by the gate.",
            "Without the gate the output is wrong and the router gets no gradient, so it never learns.",
            "Multiply each token's result by softmax(router(x))[its expert].", no_gate),
    Mistake("not_unpermuted", "You return the results in the order sorted by expert.",
            "Each token's result must come back to its own row.",
            "Invert the sorting permutation (out[order] = results) before the gate.", not_unpermuted),
]


# What the observed values are called in the exercise, and the factors a plausible mistake scales them by.
def _gates(output: list, ungated: list, d: int) -> list[float | None]:
    """Per token row, the factor g with output ≈ g × the expert's ungated output (the gate the row was multiplied
    by), or None where no single factor fits (another expert's output, or none)."""
    gates = []
    for start in range(0, len(ungated), d):
        have, want = output[start:start + d], ungated[start:start + d]
        norm = sum(w * w for w in want)
        g = sum(h * w for h, w in zip(have, want)) / norm if norm else None
        fits = g is not None and all(abs(h - g * w) <= 1e-4 + 1e-3 * abs(h) for h, w in zip(have, want))
        gates.append(g if fits else None)
    return gates


def gates_not_over_experts(student, reference) -> str:
    """Gates a softmax over the experts cannot give: its largest entry is at least 1/E, and the exercise gates each
    token by its expert's probability, the largest. Where a token row is its expert's output times a gate below
    1/E, the router's softmax is not taken over the experts (for each expert, a rank's gates summing to at most 1
    is what a softmax over the tokens gives)."""
    small, seen, sums = 0, 0, []
    for key, dense in reference["dense"].items():
        case = reference["scenarios"][key]["case"]
        for rank, record in enumerate(_ranks(student, key)):
            gates = [g for g in _gates(record["output"], dense["ungated"][rank], case["d"]) if g is not None]
            seen += len(gates)
            small += sum(0 < g < 1 / case["experts"] - 1e-6 for g in gates)
            sums.append(sum(gates))
    if small < 2 or small < seen / 4:
        return ""
    return (f"The gates are not softmax probabilities over the experts: {small} of the {seen} token rows that hold "
            "their expert's output are multiplied by a gate below 1/E (E experts), and a softmax over the experts "
            "gives its largest entry at least 1/E. Each token's gate row must sum to 1 over the experts "
            "(softmax over the last dimension); gates this small are what a softmax over the tokens gives (summing "
            "to 1 over a rank's tokens).")


LOCATE = Locate(narrow=gates_not_over_experts,
                names={"output": "the output", "x_grad": "x's gradient", "expert_grads": "the experts' gradients",
                       "router_grad": "the router's gradient", "tokens_per_expert": "the tokens per expert"},
                positions={"expert_grads": "local expert {n}"},
                ignore=("forward", "backward", "forbidden", "unsorted", "ungated"),
                factors=lambda case: {"world_size": case["world_size"], "the number of experts": case["experts"]},
                rows={"output": lambda case: (0, case["d"], "token row"),
                      "x_grad": lambda case: (0, case["d"], "token row")})
