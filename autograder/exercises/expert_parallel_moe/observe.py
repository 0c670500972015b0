"""Observing ``ExpertParallelMoE`` on real ranks: each rank draws only its own tokens."""
import math

import torch
from torch import nn

import coursekit  # noqa: F401  keeps the profiler's back end quiet on stderr (KINETO_LOG_LEVEL)

from ..beside.observing import float32_data, gloo_events, tensor_data
from ..beside.ranks import observe_on_ranks, student_call
from .cases import IDLE, SKEW, cases


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


def checksums(module: nn.Module) -> list[float]:
    """A module's gradients in two numbers per parameter, its sum and its norm (zeros where no token reached it)."""
    found = []
    for p in module.parameters():
        g = p.grad.detach().double() if p.grad is not None else torch.zeros(1, dtype=torch.float64)
        found += [float(g.sum()), float(g.norm())]
    return found


def row_sums(t: torch.Tensor) -> list[float]:
    return float32_data(t.detach().double().sum(dim=-1))


def fingerprint(y: torch.Tensor, experts) -> dict:
    """The traffic scenario's record of one rank, small: the sum of every row of y (each token's), and its experts'
    gradient checksums (they need every rank's tokens routed to them, and the backward's all-to-alls)."""
    return {"output": row_sums(y), "expert_grads": [checksums(e) for e in experts]}


def traffic_truth(case: dict) -> dict:
    """The dense MoE's fingerprint of the traffic scenario, per rank (its own tokens, its own experts)."""
    _, experts, _, y, _ = dense_run(case)
    sizes, per_rank = case["tokens"], case["experts"] // case["world_size"]
    return {"ranks": [fingerprint(part, experts[r * per_rank:(r + 1) * per_rank])
                      for r, part in enumerate(y.split(sizes))]}


def dense_run(case: dict):
    """The whole MoE in one process over all ranks' tokens, with the true experts, forward and backward: router,
    experts, x, y (gradients in place), and (gate, expert outputs, chosen expert) per token."""
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
    return router, experts, x, y, (gate, expert_out, chosen)


def dense_moe(case: dict) -> dict:
    """The whole MoE in one process over all ranks' tokens, with the true experts: every rank's slice of the
    output and of x.grad, every expert's gradient, the router's, the tokens per expert, and the output without
    the gate (for feedback on a missing gate)."""
    router, experts, x, y, (gate, expert_out, chosen) = dense_run(case)
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
    return [[kind, int(sum(math.prod(shape) for shape in shapes if shape))] for kind, shapes in gloo_events(prof)]


def checked_output(y, x: torch.Tensor):
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(x.shape):
        got = f"shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"forward(x) returned {got}, not one output row per token, shape {tuple(x.shape)}")
    return y


def moe_rank(rank: int, world_size: int, cls, case: dict) -> dict:
    """One rank: the student's module from the router and the (partly per-rank) experts, one forward and one
    backward of this rank's tokens, measured."""
    from torch.profiler import ProfilerActivity, profile

    router, experts = make_layers(case, rank)
    x, upstream = rank_tokens(case, rank)
    x.requires_grad_(True)
    module = student_call(cls, router, experts)
    per_rank = case["experts"] // world_size
    if case["measure_traffic"]:  # measured from outside: no profiler (a per-token loop under it takes seconds)
        y = student_call(checked_output, student_call(module, x), x)
        student_call((y * upstream).sum().backward)
        return fingerprint(y, experts[rank * per_rank:(rank + 1) * per_rank])
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as forward_prof:
        y = student_call(module, x)
    y = student_call(checked_output, y, x)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as backward_prof:
        student_call((y * upstream).sum().backward)
    router_grads = [p.grad for p in router.parameters()]
    return {"output": tensor_data(y), "x_grad": None if x.grad is None else tensor_data(x.grad),
            "expert_grads": [expert_grads(experts[e]) for e in range(rank * per_rank, (rank + 1) * per_rank)],
            "router_grad": None if any(g is None for g in router_grads)
            else [v for g in router_grads for v in tensor_data(g)],
            "forward": collectives(forward_prof), "backward": collectives(backward_prof)}


def observe(fn, *, salt: int = 0) -> dict:
    # quiet: gloo's own abort message on mismatched split sizes would reach the notebook's stderr
    return observe_on_ranks(salt, cases(salt), moe_rank, fn, profiler=True, quiet=True)


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    result["dense"] = {name: dense_moe(s["case"]) for name, s in result["scenarios"].items() if name != "traffic"}
    result["scenarios"]["traffic"]["truth"] = traffic_truth(result["scenarios"]["traffic"]["case"])
    return result
