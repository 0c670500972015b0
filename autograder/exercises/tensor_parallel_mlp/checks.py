"""The checks of ``TensorParallelMLP``: plain Python on the observations (no torch here)."""
from ..judging.checking import (
    case,
    close,
    expected_at_gates,
    gate_problem,
    measured_privately,
    rank_results,
    scenario,
    sketch_error,
)
from .cases import ATOL, ROLES, SEEDED_X_GRAD, TRAFFIC_RATIO

DTENSOR = ("Your module uses torch.distributed.tensor (parallelize_module or DTensor), which does this exercise for "
           "you: split the layers and write f and g yourself, as the lesson asks, to earn the points.")


SHAPE_HINT = ("nn.Linear's weight is (out_features, in_features): fc1 keeps a block of rows, fc2 the same block of "
              "columns.")


def ranks_of(student: dict, reference: dict, key: str) -> list[dict]:
    """The scenario's per-rank records, or a ScenarioError with one sentence for the student."""
    # "shapes cannot be multiplied": the classic, slicing the weight along the wrong dimension
    return rank_results(student, reference, key, forbidden=DTENSOR, reword=lambda message: f"{message} {SHAPE_HINT}"
                        if "shapes cannot be multiplied" in message else message)


def single(reference: dict, key: str) -> dict:
    return reference["single"][key]


def shard_grads_problem(ranks: list[dict], want: dict, label: str) -> str | None:
    for rank, (r, w) in enumerate(zip(ranks, want["shards"])):
        for role in ROLES:
            got = r["shards"][role]
            if got is None:
                return (f"{label}, rank {rank} holds no parameter shaped like its shard of {role}: keep the shards as "
                        "parameters (nn.Parameter) with the shapes the docstring gives.")
            if got["grad"] is None:
                return (f"{label}, rank {rank}'s shard of {role} got no gradient: compute with the shard parameters "
                        "themselves, so that backward() reaches them.")
            if not close(got["grad"], w[role]["grad"], atol=ATOL, rtol=1e-4):
                return (f"{label}, rank {rank}'s gradient of its {role} shard is not its slice of the single-process "
                        "gradient: check which slice it holds, and that g's backward passes dL/dy on unchanged.")
    return None


def outputs_problem(ranks: list[dict], want: dict, label: str) -> str | None:
    for rank, r in enumerate(ranks):
        if not close(r["output"], want["output"], atol=ATOL, rtol=1e-4):
            return (f"{label}, rank {rank}'s output differs from the single-process MLP's: sum the partial outputs over "
                    "the ranks once (g), then add fc2's bias once.")
    return None


def x_grad_problem(ranks: list[dict], want: dict, label: str) -> str | None:
    for rank, r in enumerate(ranks):
        if r["x_grad"] is None:
            return (f"{label}, x.grad is None on rank {rank}: the input's gradient must flow back through your "
                    "autograd functions (an all-reduce outside autograd cuts the graph).")
        if not close(r["x_grad"], want["x_grad"], atol=ATOL, rtol=1e-4):
            return (f"{label}, rank {rank}'s x.grad is not the single-process input gradient: each rank holds only its "
                    "shard's part of it, so f's backward must sum it over the ranks.")
    return None


def columns(flat: list, rows: int, cols: int) -> list[list[float]]:
    """The columns of a row-major (rows × cols) matrix given as a flat list."""
    return [[float(flat[i * cols + j]) for i in range(rows)] for j in range(cols)]


def shards_really_computed(got: dict, want: dict) -> str | None:
    """The evidence: every rank holds an fc2.weight-shaped shard whose gradient's columns are columns of the
    single-process gradient (each one needs the real GELU activation of one hidden unit of the seeded problem and
    the real upstream gradient). A count, and an output that the unsplit MLP on every rank also gets right, are
    believed only with it."""
    c = want["case"]
    if c["measure_traffic"]:
        return fingerprint_problem(got, want, "output")
    d_out, k = c["d_out"], c["per_rank"]
    true_columns = [col for w in want["ranks"] for col in columns(w["shards"]["fc2.weight"]["grad"], d_out, k)]
    ranks = got.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != len(want["ranks"]):
        return f"when {c['what']}, the grader found no results for every rank."
    for r in ranks:
        mine = (r.get("shards") or {}).get("fc2.weight") or {}
        grad = mine.get("grad")
        if not isinstance(grad, list) or len(grad) != d_out * k or not all(
                any(close(col, true, atol=ATOL, rtol=1e-4) for true in true_columns)
                for col in columns(grad, d_out, k)):
            return (f"when {c['what']}, the ranks hold no fc2.weight shard (shape (d_out, h/N)) whose gradient comes "
                    "from the grader's seeded problem: each rank must compute with its own shards.")
    return None


def fingerprint_problem(got: dict, want: dict, name: str) -> str | None:
    """The traffic scenario's evidence: every rank's first rows of ``name`` (the output, or x.grad) are the
    single-process MLP's, and so is a sketch of all its rows (on vectors secret under a held-out salt: a few rows
    can be computed alone). With each rank's layers true only in its own block, no rank computes them alone.
    x.grad's truth is the launcher's recomputation under the upstream gradient its seed drew at the gate between the
    passes (``observe.expected_passes``): a rank that summed x.grad before that gate was answered gets it wrong."""
    c = want["case"]
    ranks = got.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != c["world_size"]:
        return f"when {c['what']}, the grader found no results for every rank."
    for rank, r in enumerate(ranks):
        truth = {"rows": want["truth"]["output"], "sketch": want["truth"]["sketch"]["output"]} if name == "output" \
            else x_grad_truth(got, rank)
        if truth is None:
            return (f"when {c['what']}, the grader could not recompute x.grad (rank {rank} did not stop once at its "
                    "pause between forward and backward).")
        key = "output" if name == "output" else SEEDED_X_GRAD
        sketches = r.get("sketch") if isinstance(r, dict) and isinstance(r.get("sketch"), dict) else {}
        if not isinstance(r, dict) or not close(r.get(key), truth["rows"], atol=ATOL, rtol=1e-4) or \
                sketch_error(sketches.get(key), truth["sketch"]) > 1e-3:
            if name == "output":
                return f"when {c['what']}, the ranks' outputs are not the single-process MLP's."
            return (f"when {c['what']}, rank {rank}'s x.grad is not the one the grader's backward gives (its upstream "
                    "gradient is drawn when the grader's pause between the passes is answered, so x.grad computed "
                    "or summed before it comes out wrong).")
    return None


def x_grad_truth(got: dict, rank: int) -> dict | None:
    """The launcher's x.grad (first rows and sketch) for ``rank``, from its recomputation; None where it has none."""
    found = expected_at_gates(got.get("meter") or {"gates": {}}, "x_grad") if isinstance(got, dict) else None
    truth = found[rank] if isinstance(found, list) and rank < len(found) else None
    return truth if isinstance(truth, dict) and isinstance(truth.get("rows"), list) else None


def pause_problem(meter: dict, rank: int, reference: dict) -> str | None:
    """Whether rank ``rank`` stopped exactly once at the grader's pause between the passes, with the output its
    forward gives (checking.gate_problem); the words that finish "rank 0 ..." when not."""
    want = reference["scenarios"]["traffic"]
    return gate_problem(meter, rank, 1, want["meter"],
                        words=("its forward and backward have", "an output the forward does not give"))


# ---- the checks ----------------------------------------------------------------------------------

def combined_problem(ranks: list[dict], want: dict, label: str) -> str | None:
    """The rule for the shard checks (issue 37): a shard's value or gradient counts only when the ranks' results
    combine. Each rank's layers are true only in its own block, so the output or x.grad equals the single-process
    MLP's on every rank only when the ranks summed their parts (g, or f's backward); a rank that runs the whole MLP
    itself, around shard-shaped parameters, gets neither."""
    if outputs_problem(ranks, want, label) is None or x_grad_problem(ranks, want, label) is None:
        return None
    return (f"{label}, neither the output nor x.grad equals the single-process MLP's on every rank: your ranks do not "
            "combine their blocks (g sums the partial outputs, f's backward sums x.grad), and the shards count only "
            "when they do.")


def check_shards(student, reference):
    c = case(reference, "two_ranks")
    want = single(reference, "two_ranks")
    ranks = ranks_of(student, reference, "two_ranks")
    for rank, r in enumerate(ranks):
        for role in ROLES:
            got = r["shards"][role]
            if got is None or not close(got["value"], want["shards"][rank][role]["value"], atol=0.0):
                part = {"fc1.weight": "rows (output features) of fc1.weight",
                        "fc1.bias": "entries of fc1.bias", "fc2.weight": "columns (input features) of fc2.weight",
                        "fc2.bias": "whole fc2.bias"}[role]
                if role == "fc2.bias":
                    return (f"On {c['world_size']} ranks, rank {rank} does not keep the whole fc2.bias, unchanged, "
                            "as a parameter: keep all of it and add it once, after g.")
                return (f"On {c['world_size']} ranks, rank {rank} does not keep the {part} (block {rank} of "
                        f"{c['world_size']}, contiguous) as a parameter: nn.Linear's weight is (out_features, "
                        "in_features), so column-parallel fc1 splits its rows.")
    return combined_problem(ranks, want, f"On {c['world_size']} ranks")


def check_output(student, reference):
    return outputs_problem(ranks_of(student, reference, "two_ranks"), single(reference, "two_ranks"),
                           f"On {case(reference, 'two_ranks')['world_size']} ranks")


def check_x_grad(student, reference):
    return x_grad_problem(ranks_of(student, reference, "two_ranks"), single(reference, "two_ranks"),
                          f"On {case(reference, 'two_ranks')['world_size']} ranks")


def check_weight_grads(student, reference):
    ranks, want = ranks_of(student, reference, "two_ranks"), single(reference, "two_ranks")
    label = f"On {case(reference, 'two_ranks')['world_size']} ranks"
    return shard_grads_problem(ranks, want, label) or combined_problem(ranks, want, label)


def check_three_ranks(student, reference):
    ranks, want = ranks_of(student, reference, "three_ranks"), single(reference, "three_ranks")
    label = f"On {case(reference, 'three_ranks')['world_size']} ranks"
    return outputs_problem(ranks, want, label) or x_grad_problem(ranks, want, label) or \
        shard_grads_problem(ranks, want, label)


def count_problem(student, reference, phase: str, words: str) -> str | None:
    """Exactly one all-reduce in the pass, as the ranks' own record (the profiler) says, which only shapes the
    feedback: the points need the bytes measured outside the ranks to agree (``traffic_problem``)."""
    for key in ("two_ranks", "three_ranks"):
        n = case(reference, key)["world_size"]
        for rank, r in enumerate(ranks_of(student, reference, key)):
            counts = {str(kind): int(count) for kind, count in r[phase]}
            all_reduces = int(counts.get("all_reduce", 0))
            others = sorted(kind for kind, count in counts.items() if kind != "all_reduce" and int(count))
            if all_reduces != 1 or others:
                extra = f" and {', '.join(others)}" if others else ""
                return (f"On {n} ranks, rank {rank}'s {words} ran {all_reduces} all-reduce(s){extra}, not exactly "
                        f"one all-reduce: {'g' if phase == 'forward' else 'f'} should do it, "
                        f"{'f' if phase == 'forward' else 'g'} none.")
    return None


def pass_bytes(meter, c: dict) -> dict[str, float] | None:
    """Bytes sent on the loopback (the launcher's counter, outside the ranks) by the forward pass (with the process
    group's start: the same for every submission) and by the backward pass; None when a reading is missing. The
    forward's are read when the last rank reaches the gate after its forward (StopAllAtGates): every rank has
    finished its forward then, and none has started its backward."""
    gates = meter.get("gates") if isinstance(meter, dict) else None
    records = gates.get("records") if isinstance(gates, dict) else None
    total = meter.get("lo_bytes") if isinstance(meter, dict) else None
    if not isinstance(records, list) or not isinstance(total, int | float):
        return None
    at_gate = {r.get("rank"): r.get("sent_bytes") for r in records if r.get("index") == 0}
    if sorted(k for k in at_gate if isinstance(k, int)) != list(range(c["world_size"])) or \
            not all(isinstance(v, int | float) for v in at_gate.values()):
        return None
    forward = float(max(at_gate.values()))
    return {"forward": forward, "backward": float(total) - forward}


def traffic_problem(student, reference, phase: str) -> str | None:
    """The pass's bytes on the loopback within TRAFFIC_RATIO of the reference's (one all-reduce of a (batch, d)
    tensor), where the results show the real computation."""
    c = case(reference, "traffic")
    ranks_of(student, reference, "traffic")
    got = pass_bytes(scenario(student, "traffic", c["what"])["meter"], c)
    if got is None:
        return f"When {c['what']}, the grader could not read the bytes your ranks sent in each pass."
    want = reference["scenarios"]["traffic"]
    meter = scenario(student, "traffic", c["what"])["meter"]
    for rank in range(c["world_size"]):
        problem = pause_problem(meter, rank, reference)
        if problem:
            return (f"When {c['what']}, rank {rank} {problem}: let only the grader stop your ranks between forward and "
                    "backward (its pause splits the bytes of the two passes).")
    if phase == "backward":
        problem = fingerprint_problem(student["scenarios"]["traffic"], want, "x_grad")
        if problem:
            return f"This could not be confirmed: {problem}"
    if not measured_privately(scenario(student, "traffic", c["what"])["meter"], want["meter"]):
        return None  # bytes judged in the grader's sandbox only (checking.measured_privately)
    ratio = got[phase] / pass_bytes(want["meter"], c)[phase]
    if 1 / TRAFFIC_RATIO <= ratio <= TRAFFIC_RATIO:
        return None
    tensor = "the (batch, d_out) partial outputs in g" if phase == "forward" else "the (batch, d_in) input gradient in f"
    return (f"When {c['what']}, your ranks sent {ratio:.2g} times the reference's bytes in the {phase} pass "
            f"(measured outside your process): it all-reduces {tensor} once, and nothing else travels (no gather of "
            "activations or weights).")


def check_forward_count(student, reference):
    return count_problem(student, reference, "forward", "forward pass") or traffic_problem(student, reference,
                                                                                           "forward")


def check_backward_count(student, reference):
    return count_problem(student, reference, "backward", "backward pass") or traffic_problem(student, reference,
                                                                                             "backward")
