"""The checks of ``ExpertParallelMoE``: plain Python on the observations (no torch here)."""

from ..judging.checking import case, close, max_abs_diff, measured_privately, rank_results, scenario
from .cases import ATOL, ROW_SUM_ATOL, RTOL, TRAFFIC_RATIO

ABORTED_HINT = ("in an all-to-all whose split sizes did not match between ranks: exchange the per-rank counts first, "
                "and receive exactly what each rank sends you (output_split_sizes = the counts you received).")


def ranks_of(student: dict, reference: dict, key: str) -> list[dict]:
    """The scenario's per-rank records, exactly one per rank, or a ScenarioError with one sentence."""
    return rank_results(student, reference, key, reword=lambda message: message.replace(
        ": a message arrived with another size than the rank receiving it expected. Every rank must send and receive "
        "tensors of the same shapes as its peers expect.", f" {ABORTED_HINT}"))


def same_rows(got: list, want: list, width: int) -> bool:
    """got holds want's rows in some order (within round-off): the results came back, unsorted."""
    if not isinstance(got, list) or len(got) != len(want):
        return False
    rows = lambda flat: sorted(tuple(round(float(v), 4) for v in flat[i:i + width])  # noqa: E731
                               for i in range(0, len(flat), width))
    return all(max_abs_diff(list(a), list(b)) < 1e-3 for a, b in zip(rows(got), rows(want)))


def output_problem(ranks: list[dict], dense: dict, c: dict) -> str | None:
    for rank, r in enumerate(ranks):
        want = dense["output"][rank]
        if close(r["output"], want, atol=ATOL, rtol=RTOL):
            continue
        where = f"When {c['what']}, rank {rank}'s output differs from the dense MoE's"
        if close(r["output"], dense["ungated"][rank], atol=ATOL, rtol=RTOL):
            return f"{where}: it is the experts' output without the gate; multiply each row by its gate."
        if close(r["output"], dense["unsorted"][rank], atol=ATOL, rtol=RTOL) or same_rows(r["output"], want, c["d"]):
            return (f"{where}: the results are in the wrong rows. They come back sorted by expert; put each one back "
                    "in its token's row (invert the permutation you sorted by) before multiplying by the gate.")
        return (f"{where}: route each token to argmax(router(x)), run the expert that owns it (experts[e] on rank "
                "e // (E/N), the e − r·E/N-th of your own), and bring the result back to the token's row.")
    return None


def x_grad_problem(ranks: list[dict], dense: dict, c: dict) -> str | None:
    for rank, r in enumerate(ranks):
        if r["x_grad"] is None or not close(r["x_grad"], dense["x_grad"][rank], atol=ATOL, rtol=RTOL):
            return (f"When {c['what']}, rank {rank}'s x.grad is not the dense MoE's: the dispatch and the combine "
                    "must be autograd functions whose backward sends the gradients back the way the tokens came (an "
                    "all-to-all with the split sizes swapped).")
    return None


def experts_problem(ranks: list[dict], dense: dict, c: dict) -> str | None:
    per_rank = c["experts"] // c["world_size"]
    for rank, r in enumerate(ranks):
        got = r["expert_grads"]
        for j in range(per_rank):
            e = rank * per_rank + j
            if not isinstance(got, list) or len(got) != per_rank or \
                    not close(got[j], dense["expert_grads"][e], atol=ATOL, rtol=RTOL):
                return (f"When {c['what']}, the gradient of expert {e} (on rank {rank}) is not the dense MoE's: "
                        "run each of your own experts (the modules you were given, not copies) on all the tokens "
                        "routed to it from every rank.")
    return None


def router_problem(ranks: list[dict], dense: dict, c: dict) -> str | None:
    grads = [r["router_grad"] for r in ranks]
    if any(g is None for g in grads):
        return (f"When {c['what']}, the router got no gradient on some rank: the gate (softmax of the router's "
                "logits at the chosen expert) must multiply the output, so that the router learns.")
    total = [sum(float(g[i]) for g in grads) for i in range(len(grads[0]))]
    if any(len(g) != len(grads[0]) for g in grads) or not close(total, dense["router_grad"], atol=ATOL, rtol=RTOL):
        return (f"When {c['what']}, the router's gradient summed over the ranks is not the dense MoE's: gate = "
                "softmax(router(x))[e] of each token's own expert, on this rank's tokens only.")
    return None


def check_output(student, reference):
    return output_problem(ranks_of(student, reference, "two_ranks"), reference["dense"]["two_ranks"],
                          case(reference, "two_ranks"))


def check_x_grad(student, reference):
    return x_grad_problem(ranks_of(student, reference, "two_ranks"), reference["dense"]["two_ranks"],
                          case(reference, "two_ranks"))


def check_experts(student, reference):
    return experts_problem(ranks_of(student, reference, "two_ranks"), reference["dense"]["two_ranks"],
                           case(reference, "two_ranks"))


def check_router(student, reference):
    return router_problem(ranks_of(student, reference, "two_ranks"), reference["dense"]["two_ranks"],
                          case(reference, "two_ranks"))


def check_more_ranks(student, reference):
    for key in ("three_ranks_skewed", "four_ranks"):
        ranks, dense, c = ranks_of(student, reference, key), reference["dense"][key], case(reference, key)
        problem = output_problem(ranks, dense, c) or x_grad_problem(ranks, dense, c) or \
            experts_problem(ranks, dense, c) or router_problem(ranks, dense, c)
        if problem:
            return problem
    return None


METHOD_SCENARIOS = ("two_ranks", "three_ranks_skewed")
EVIDENCE_SCENARIOS = (*METHOD_SCENARIOS, "traffic")
MIB = 1 << 20
NOT_FOR_TOKENS = ("all_gather", "all_reduce", "broadcast", "reduce_scatter", "gather", "scatter", "send", "recv")


def traffic_problem(student, reference) -> str | None:
    """The traffic scenario's bytes on the loopback (the launcher's counter, outside the ranks) within TRAFFIC_RATIO
    of the reference's, either way."""
    c = case(reference, "traffic")
    ranks_of(student, reference, "traffic")
    got = scenario(student, "traffic", c["what"])["meter"]["lo_bytes"]
    want = reference["scenarios"]["traffic"]["meter"]["lo_bytes"]
    if not isinstance(got, int | float) or got < 0:
        return f"When {c['what']}, the grader could not read the bytes your ranks sent."
    if not measured_privately(scenario(student, "traffic", c["what"])["meter"], reference["scenarios"]["traffic"]["meter"]):
        return None  # bytes judged in the grader's sandbox only (checking.measured_privately)
    ratio = got / want
    if 1 / TRAFFIC_RATIO <= ratio <= TRAFFIC_RATIO:
        return None
    return (f"When {c['what']}, your ranks sent {ratio:.2g} times the reference's bytes ({got / MIB:.0f} MiB, measured "
            "outside your process): a token that leaves its rank travels by all-to-all to its expert and back, in "
            "both passes; gathering every token on every rank sends about N times that.")


def check_all_to_all(student, reference):
    """Dispatch and combine are all-to-alls in the forward, and again in the backward; nothing else carries tokens
    (the ranks' own record, which shapes the feedback). The points need the bytes measured outside the ranks to
    agree (``traffic_problem``)."""
    for key in METHOD_SCENARIOS:
        c = case(reference, key)
        for rank, r in enumerate(ranks_of(student, reference, key)):
            for phase in ("forward", "backward"):
                ops = r[phase]
                token_sized = sorted({str(kind) for kind, values in ops
                                      if str(kind) in NOT_FOR_TOKENS and int(values) >= c["d"]})
                if token_sized:
                    return (f"When {c['what']}, rank {rank}'s {phase} pass moved tokens with {', '.join(token_sized)}: "
                            "tokens travel only by all-to-all (each token to the rank of its expert and back).")
                if sum(str(kind) == "all_to_all" for kind, _ in ops) < 2:
                    return (f"When {c['what']}, rank {rank}'s {phase} pass ran fewer than two all-to-alls: dispatch "
                            "and combine are one each, in the forward and (as autograd functions) in the backward.")
    return traffic_problem(student, reference)


def moe_really_ran(got: dict, want: dict) -> str | None:
    """The evidence: every rank's output and its experts' gradients are the reference's. The experts' gradients
    need every rank's tokens, and the outputs need the experts only their owners hold: no rank gets either alone."""
    ranks = got.get("ranks")
    c = want["case"]
    if not isinstance(ranks, list) or len(ranks) != c["world_size"]:
        return f"when {c['what']}, the grader found no result from every rank."
    if c["measure_traffic"]:
        return fingerprint_problem(ranks, want)
    for r, w in zip(ranks, want["ranks"]):
        if not isinstance(r, dict) or not close(r.get("output"), w["output"], atol=ATOL, rtol=RTOL) or \
                not isinstance(r.get("expert_grads"), list) or len(r["expert_grads"]) != len(w["expert_grads"]) or \
                not all(close(g, h, atol=ATOL, rtol=RTOL) for g, h in zip(r["expert_grads"], w["expert_grads"])):
            return f"when {c['what']}, the outputs and experts' gradients are not the grader's problem's."
    return None


def fingerprint_problem(ranks: list, want: dict) -> str | None:
    """The traffic scenario's evidence: every rank's output row sums and its experts' gradient checksums are the
    dense MoE's."""
    for r, w in zip(ranks, want["truth"]["ranks"]):
        grads = r.get("expert_grads") if isinstance(r, dict) else None
        if not close(r.get("output") if isinstance(r, dict) else None, w["output"], atol=ROW_SUM_ATOL, rtol=RTOL) or \
                not isinstance(grads, list) or len(grads) != len(w["expert_grads"]) or \
                not all(close(g, h, atol=ATOL + RTOL * max(abs(v) for v in h), rtol=RTOL)
                        for g, h in zip(grads, w["expert_grads"])):
            return f"when {want['case']['what']}, the outputs and experts' gradients are not the dense MoE's."
    return None
