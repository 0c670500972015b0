"""Lesson 8 exercise: ``ExpertParallelMoE(router, experts)``, a top-1 mixture of experts split over the ranks.

``router: nn.Linear(d, E)``; ``experts``: an ``nn.ModuleList`` of E modules mapping (t, d) → (t, d); E divisible by
the world size N. Rank r owns experts ``[r·E/N, (r+1)·E/N)`` and keeps those modules themselves and the router.
``forward(x)``, x: (t, d) this rank's tokens (t differs between ranks): logits = router(x), e = argmax, gate =
softmax(logits)[e], yᵢ = gateᵢ · expert_{eᵢ}(xᵢ); no token dropped. Tokens travel to the rank that owns their expert
and back with all-to-all, inside autograd functions, so that backward leaves x.grad, the router's gradient from this
rank's tokens, and each local expert's gradient from every rank's tokens routed to it.

The grader really runs it on 2, 3 and 4 forked gloo ranks with uneven token counts (and, on 3 ranks, a router
biased towards the first experts: many tokens for rank 0, none for the last rank, which must still take part in
every all-to-all, forward and backward). Inputs that require the method:
each rank draws only its own tokens, and on rank r the experts it does not own hold *other* weights (drawn per rank),
so a rank that runs other ranks' experts itself gets wrong values. Each rank records its output, x.grad, its own
experts' gradients, the router's gradient, and, for feedback, every gloo collective of the forward and of the
backward with its size (torch's profiler, ``gloo:<kind>``, whatever API issued it). The reference observation adds
the dense single-process MoE over all ranks' tokens with the true experts (in the grader's process).

Method ("all-to-all, not gather"). Here the method check reads the in-process record (at least two all-to-alls in
the forward and two in the backward, no all-gather / all-reduce / broadcast / point-to-point message of token size):
a student's process can forge it. To be measured outside the student's process instead
(``bench/lesson8_method_evidence.py``): the bytes each rank writes to its sockets (``/proc/<pid>/io`` wchar, gloo's
TCP sends on loopback), forward and backward. All-to-alls send each token once each way: 4·(N−1)/N·|tokens| per
rank; a value-correct gather (all-gather the tokens, all-reduce the outputs, autograd-aware) sends several times
that, growing with N. Measured (2-core CPU, torch 2.13.0+cpu, gloo, load average 59 from other jobs), t = 4096
tokens of d = 256 per rank (|tokens| = 4 MiB), experts Linear–Tanh–Linear:

    N = 2, E = 4   reference all-to-all   sent  8.1 MiB per rank   peak RSS 65–74 MiB
                   all-gather + reduce    sent 24.0 MiB per rank   peak RSS 156–170 MiB
    N = 4, E = 8   reference all-to-all   sent 11.7–12.3 MiB       peak RSS 68–70 MiB
                   all-gather + reduce    sent 72.0 MiB per rank   peak RSS 187–233 MiB

A threshold of 4·|tokens| per rank (the all-to-alls' ceiling, whatever N), or twice the reference's bytes in the same
batch, separates them with room on both sides; peak memory agrees. At the graded sizes (tens of tokens) gloo's
per-message overhead dominates: measure in a scenario of its own at this size. The grading scenarios cost
0.34–0.38 s per observation (all three, salts 1–3, load average 14).
"""
import math
import os
import warnings

import torch
from torch import nn

import coursekit  # noqa: F401  keeps the profiler's back end quiet on stderr (KINETO_LOG_LEVEL)

from ..exercise import (
    Check,
    Exercise,
    ScenarioError,
    case,
    close,
    held_out_rng,
    max_abs_diff,
    observation,
    run_on_ranks,
    salted_seed,
    scenario,
    student_call,
    tensor_data,
    what,
)

LAUNCH_TIMEOUT_S = 8.0  # a correct scenario takes well under a second
ATOL, RTOL = 1e-5, 1e-4  # float32 round-off: an expert's rows in another order, sums of partial gradients
ABORTED = "aborted by gloo"  # a rank killed by SIGABRT: split sizes that do not match between ranks

SCENARIOS = {  # name: (world size, experts, router biased towards the first experts, what it is)
    "two_ranks": (2, 4, False, "called on 2 ranks (4 experts, 2 per rank, uneven token counts)"),
    "three_ranks_skewed": (3, 6, True, "called on 3 ranks (6 experts) with a router that sends most tokens to the "
                                       "first experts and none to the last rank's"),
    "four_ranks": (4, 4, False, "called on 4 ranks (4 experts, 1 per rank)"),
}
PUBLIC_SIZES = {  # tokens per rank, d, expert hidden width
    "two_ranks": ([5, 9], 8, 12),
    "three_ranks_skewed": ([7, 3, 10], 8, 10),
    "four_ranks": ([4, 6, 3, 5], 6, 8),
}
SKEW = (2.5, 1.5)  # added to the router's bias of experts 0 and 1
IDLE = -20.0       # added to the bias of the last rank's experts: that rank receives no token at all


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs; held-out salts draw other token counts (uneven, 2 to 12 per rank), widths and
    seeds. d is larger than the number of experts, so a message of d values or more carries tokens, not counts."""
    found = {}
    for i, (name, (world_size, experts, skewed, words)) in enumerate(SCENARIOS.items()):
        if salt == 0:
            tokens, d, hidden = PUBLIC_SIZES[name]
        else:
            rng = held_out_rng(salt, f"sizes of {name}")
            tokens = [rng.randint(2, 12) for _ in range(world_size)]
            while len(set(tokens)) == 1:
                tokens = [rng.randint(2, 12) for _ in range(world_size)]
            d, hidden = rng.choice([8, 10, 12]), rng.randint(6, 14)
        found[name] = {"what": words, "world_size": world_size, "experts": experts, "skewed": skewed,
                       "tokens": list(tokens), "d": d, "hidden": hidden, "seed": salted_seed(700 + i, salt)}
    return found


# ---- the problem ---------------------------------------------------------------------------------------

def make_layers(case: dict, rank: int | None = None) -> tuple[nn.Linear, nn.ModuleList]:
    """The router and the experts. With ``rank``, the experts that rank does not own get weights of their own
    (other on every rank): only the owner holds an expert's true weights."""
    torch.manual_seed(case["seed"])
    d, n_experts = case["d"], case["experts"]
    router = nn.Linear(d, n_experts)
    if case["skewed"]:
        with torch.no_grad():
            router.bias[:len(SKEW)] += torch.tensor(SKEW)
            router.bias[n_experts - n_experts // case["world_size"]:] += IDLE
    experts = nn.ModuleList(nn.Sequential(nn.Linear(d, case["hidden"]), nn.Tanh(), nn.Linear(case["hidden"], d))
                            for _ in range(n_experts))
    if rank is not None:
        per_rank = n_experts // case["world_size"]
        generator = torch.Generator().manual_seed(case["seed"] * 16 + 8 + rank)
        with torch.no_grad():
            for e, expert in enumerate(experts):
                if e // per_rank != rank:
                    for p in expert.parameters():
                        p.copy_(torch.randn(p.shape, generator=generator))
    return router, experts


def rank_tokens(case: dict, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's tokens and the upstream gradient dL/dy (the loss is (y · upstream).sum())."""
    generator = torch.Generator().manual_seed(case["seed"] * 16 + rank)
    t, d = case["tokens"][rank], case["d"]
    return torch.randn(t, d, generator=generator), torch.randn(t, d, generator=generator)


def expert_grads(expert: nn.Module) -> list[float]:
    """An expert's gradients, flat; zeros where no token reached it (autograd leaves .grad None there)."""
    return [v for p in expert.parameters()
            for v in (tensor_data(p.grad) if p.grad is not None else [0.0] * p.numel())]


def dense_moe(case: dict) -> dict:
    """The whole MoE in one process over all ranks' tokens, with the true experts: every rank's slice of the
    output and of x.grad, every expert's gradient, the router's, the tokens per expert, and the output without
    the gate (for feedback on a missing gate)."""
    router, experts = make_layers(case)
    xs, ups = zip(*(rank_tokens(case, r) for r in range(case["world_size"])))
    x = torch.cat(xs).requires_grad_(True)
    probs = router(x).softmax(-1)
    chosen = probs.argmax(-1)
    gate = probs.gather(-1, chosen[:, None])
    expert_out = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        rows = (chosen == e).nonzero().squeeze(1)
        expert_out = expert_out.index_put((rows,), expert(x[rows]))
    y = gate * expert_out
    (y * torch.cat(ups)).sum().backward()
    sizes = case["tokens"]
    unsorted = []  # each rank's results left in expert order, times the gates in token order (for feedback)
    for rank_gate, rank_out, rank_chosen in zip(gate.split(sizes), expert_out.split(sizes), chosen.split(sizes)):
        unsorted.append(tensor_data(rank_gate * rank_out[rank_chosen.argsort(stable=True)]))
    return {"output": [tensor_data(part) for part in y.split(sizes)],
            "ungated": [tensor_data(part) for part in expert_out.split(sizes)],
            "unsorted": unsorted,
            "x_grad": [tensor_data(part) for part in x.grad.split(sizes)],
            "expert_grads": [expert_grads(e) for e in experts],
            "router_grad": [v for p in router.parameters() for v in tensor_data(p.grad)],
            "tokens_per_expert": torch.bincount(chosen, minlength=case["experts"]).tolist()}


# ---- observing: real ranks, the grader's own record of the collectives ----------------------------------

def collectives(prof) -> list[list]:
    """Every gloo operation the profiler saw, in order: [kind, values it carried]."""
    found = []
    for event in prof.events():
        if event.name.startswith("gloo:"):
            values = sum(math.prod(shape) for shape in event.input_shapes if shape)
            found.append([event.name.removeprefix("gloo:"), int(values)])
    return found


def checked_output(y, x: torch.Tensor):
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(x.shape):
        got = f"shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"forward(x) returned {got}, not one output row per token, shape {tuple(x.shape)}")
    return y


def moe_rank(rank: int, world_size: int, cls, case: dict) -> dict:
    """One rank: the student's module from the router and the (partly per-rank) experts, one forward and one
    backward of this rank's tokens, measured."""
    from torch.profiler import ProfilerActivity, profile

    warnings.simplefilter("ignore")  # a rank's warnings would reach the notebook's stderr, and so would
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # gloo's own abort message on mismatched split sizes
    router, experts = make_layers(case, rank)
    x, upstream = rank_tokens(case, rank)
    x.requires_grad_(True)
    module = student_call(cls, router, experts)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as forward_prof:
        y = student_call(module, x)
    y = student_call(checked_output, y, x)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as backward_prof:
        student_call((y * upstream).sum().backward)
    per_rank = case["experts"] // world_size
    router_grads = [p.grad for p in router.parameters()]
    return {"output": tensor_data(y), "x_grad": None if x.grad is None else tensor_data(x.grad),
            "expert_grads": [expert_grads(experts[e]) for e in range(rank * per_rank, (rank + 1) * per_rank)],
            "router_grad": None if any(g is None for g in router_grads)
            else [v for g in router_grads for v in tensor_data(g)],
            "forward": collectives(forward_prof), "backward": collectives(backward_prof)}


def warm_profiler() -> None:
    """The profiler's first start costs about 1.5 s; once here, not in every forked rank."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
        torch.zeros(1).add_(1)


def observe_ranks(fn, case: dict) -> dict:
    found = run_on_ranks(moe_rank, case["world_size"], fn, case, timeout=LAUNCH_TIMEOUT_S)
    if "exit code -6" in str(found.get("error", "")):  # SIGABRT: gloo's check on a message size failed
        return {"error": ABORTED}
    return found


def observe(fn, *, salt: int = 0) -> dict:
    warm_profiler()
    return observation(salt, cases(salt), lambda case: observe_ranks(fn, case))


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    result["dense"] = {name: dense_moe(s["case"]) for name, s in result["scenarios"].items()}
    return result


# ---- reading an observation (plain Python only: no torch from here on) ----------------------------------

def ranks_of(student: dict, reference: dict, key: str) -> list[dict]:
    """The scenario's per-rank records, exactly one per rank, or a ScenarioError with one sentence."""
    c = case(reference, key)
    data = student.get("scenarios", {}).get(key)
    if isinstance(data, dict) and data.get("error") == ABORTED:
        raise ScenarioError(f"When {c['what']}, gloo killed a rank (SIGABRT) in an all-to-all whose split sizes did "
                            "not match between ranks: exchange the per-rank counts first, and receive exactly what "
                            "each rank sends you (output_split_sizes = the counts you received).")
    data = scenario(student, key, what(reference, key))
    ranks = data["ranks"]
    if not isinstance(ranks, list) or len(ranks) != c["world_size"]:
        raise ScenarioError(f"When {c['what']}, the grader did not get one result per rank.")
    return ranks


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
NOT_FOR_TOKENS = ("all_gather", "all_reduce", "broadcast", "reduce_scatter", "gather", "scatter", "send", "recv")


def check_all_to_all(student, reference):
    """Dispatch and combine are all-to-alls in the forward, and again in the backward; nothing else carries tokens."""
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
    return None


def moe_really_ran(got: dict, want: dict) -> str | None:
    """The evidence: every rank's output and its experts' gradients are the reference's. The experts' gradients
    need every rank's tokens, and the outputs need the experts only their owners hold: no rank gets either alone."""
    ranks = got.get("ranks")
    c = want["case"]
    if not isinstance(ranks, list) or len(ranks) != c["world_size"]:
        return f"when {c['what']}, the grader found no result from every rank."
    for r, w in zip(ranks, want["ranks"]):
        if not isinstance(r, dict) or not close(r.get("output"), w["output"], atol=ATOL, rtol=RTOL) or \
                not isinstance(r.get("expert_grads"), list) or len(r["expert_grads"]) != len(w["expert_grads"]) or \
                not all(close(g, h, atol=ATOL, rtol=RTOL) for g, h in zip(r["expert_grads"], w["expert_grads"])):
            return f"when {c['what']}, the outputs and experts' gradients are not the grader's problem's."
    return None


EXERCISE = Exercise(
    name="ExpertParallelMoE",
    notebook="08_multidim_parallel.ipynb",
    observe=observe,
    observe_reference=observe_reference,
    evidence=moe_really_ran,
    timeout_s=45,  # three launches; a deadlocking submission spends LAUNCH_TIMEOUT_S in each
    checks=[
        Check("The output equals the dense MoE's on every rank (2 ranks)", 2, check_output),
        Check("x.grad equals the dense MoE's (2 ranks)", 2, check_x_grad),
        Check("Each local expert's gradient comes from every rank's tokens (2 ranks)", 2, check_experts),
        Check("The router's gradient, summed over the ranks, equals the dense MoE's (2 ranks)", 1, check_router),
        Check("Output and gradients are right on 3 ranks with skewed routing and on 4 ranks", 2, check_more_ranks),
        Check("Tokens travel by all-to-all in the forward and the backward, never by a gather", 2, check_all_to_all,
              evidence=METHOD_SCENARIOS),
    ],
)
