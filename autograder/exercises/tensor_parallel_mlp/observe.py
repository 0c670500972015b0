"""Observing ``TensorParallelMLP`` on real ranks; the grader's own count of collectives."""

import torch
from torch import nn

import coursekit  # noqa: F401  keeps the profiler's back end quiet on stderr (KINETO_LOG_LEVEL)

from ..beside.gating import in_launcher, step_seed
from ..beside.meter import StopAllAtGates
from ..beside.observing import collective_counts, float32_data, sketch, tensor_data
from ..beside.ranks import ask_gate, digest, observe_on_ranks, student_call
from .cases import FINGERPRINT_ROWS, SEEDED_X_GRAD, cases


def make_problem(case: dict, rank: int | None = None):
    """The full layers, the input and the upstream gradient (the same seed everywhere). With ``rank``, the layers
    as that rank gets them: only its own block of hidden units holds the true values (``poison``)."""
    torch.manual_seed(case["seed"])
    fc1, fc2 = nn.Linear(case["d_in"], case["hidden"]), nn.Linear(case["hidden"], case["d_out"])
    x = torch.randn(case["batch"], case["d_in"])
    upstream = torch.randn(case["batch"], case["d_out"])  # dL/dy: the loss is (y · upstream).sum()
    if rank is not None:
        poison(fc1, fc2, case, rank)
    return fc1, fc2, x, upstream


def poison(fc1: nn.Linear, fc2: nn.Linear, case: dict, rank: int) -> None:
    """Inputs that require the method: the rows of fc1 and the columns of fc2.weight outside this rank's block get
    values of their own, drawn per rank, so a rank that runs the whole MLP itself gets wrong values; only the
    ranks together (each with its own block) hold the true layers. fc2.bias stays true: every rank keeps it."""
    generator = torch.Generator().manual_seed(case["seed"] * 16 + 8 + rank)
    others = torch.ones(case["hidden"], dtype=torch.bool)
    others[rank * case["per_rank"]:(rank + 1) * case["per_rank"]] = False
    with torch.no_grad():
        fc1.weight[others] = torch.randn(fc1.weight[others].shape, generator=generator)
        fc1.bias[others] = torch.randn(fc1.bias[others].shape, generator=generator)
        fc2.weight[:, others] = torch.randn(fc2.weight[:, others].shape, generator=generator)


def shard_shapes(case: dict) -> dict[str, tuple[int, ...]]:
    k, d_in, d_out = case["per_rank"], case["d_in"], case["d_out"]
    return {"fc1.weight": (k, d_in), "fc1.bias": (k,), "fc2.weight": (d_out, k), "fc2.bias": (d_out,)}


def expected_shards(full: dict[str, torch.Tensor], rank: int, case: dict) -> dict[str, torch.Tensor]:
    """This rank's slice of each full tensor (a parameter or its gradient): Megatron's contiguous blocks."""
    rows = slice(rank * case["per_rank"], (rank + 1) * case["per_rank"])
    return {"fc1.weight": full["fc1.weight"][rows], "fc1.bias": full["fc1.bias"][rows],
            "fc2.weight": full["fc2.weight"][:, rows], "fc2.bias": full["fc2.bias"]}


def single_process(case: dict) -> dict:
    """The unsplit MLP in one process: its output, x.grad, and every rank's slice of its parameters and grads."""
    fc1, fc2, x, upstream = make_problem(case)
    x.requires_grad_(True)
    y = fc2(nn.functional.gelu(fc1(x)))
    (y * upstream).sum().backward()
    params = {"fc1.weight": fc1.weight, "fc1.bias": fc1.bias, "fc2.weight": fc2.weight, "fc2.bias": fc2.bias}
    values = {role: p.detach() for role, p in params.items()}
    grads = {role: p.grad for role, p in params.items()}
    return {"forbidden": False, "output": tensor_data(y), "x_grad": tensor_data(x.grad),
            "shards": [{role: {"value": tensor_data(v), "grad": tensor_data(g)}
                        for (role, v), g in zip(expected_shards(values, r, case).items(),
                                                expected_shards(grads, r, case).values())}
                       for r in range(case["world_size"])]}


# ---- observing: real processes, the grader's own count of collectives ---------------------------

def find_shards(module, case: dict) -> dict[str, torch.Tensor | None]:
    """The module's parameter for each role, found by its shape (names are the student's choice). Where two
    parameters fit one role (a kept copy of the full fc2, say), the one that received a gradient wins."""
    params = list({id(p): p for p in module.parameters()}.values()) if isinstance(module, nn.Module) else []
    found = {}
    for role, shape in shard_shapes(case).items():
        fitting = [p for p in params if tuple(p.shape) == shape]
        found[role] = next((p for p in fitting if p.grad is not None), fitting[0] if fitting else None)
    return found


def uses_dtensor(module, output) -> bool:
    from torch.distributed.tensor import DTensor

    params = list(module.parameters()) if isinstance(module, nn.Module) else []
    return isinstance(output, DTensor) or any(isinstance(p, DTensor) for p in params)


def checked_output(y, case: dict):
    """forward's result, or a ValueError in the student's words when it is not the full output."""
    want = (case["batch"], case["d_out"])
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != want:
        got = f"shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"forward(x) returned {got}, not the full output of shape {want}")
    return y


def upstream_after_gate(case: dict, answer: float | None, upstream: torch.Tensor) -> torch.Tensor:
    """dL/dy for the backward pass: drawn from the launcher's answer at the gate between the passes (one seed for
    every rank, ``gating.step_seed``), so no rank can compute its backward, or x.grad's sum, before that gate; the
    scenario's own ``upstream`` where there is no gate."""
    if answer is None:
        return upstream
    return torch.randn(upstream.shape, generator=torch.Generator().manual_seed(step_seed(case["seed"], answer)))


def tensor_parallel_rank(rank: int, world_size: int, cls, case: dict) -> dict:
    """One rank: build the student's module from this rank's layers, one forward and one backward, counted.

    Between the two passes the rank stops at a gate (in the traffic scenario; elsewhere ``ask_gate`` returns at
    once) until every rank is there, with a digest of the whole output (which no rank computes without its peers:
    the layers are poisoned); the launcher reads the bytes sent on the loopback so far: those of the forward pass
    (and of the process group's start). The gate's answer draws the backward's upstream gradient
    (``upstream_after_gate``): x.grad's sum can only travel after it, in what the launcher counts as the backward."""
    from torch.profiler import ProfilerActivity, profile

    fc1, fc2, x, upstream = make_problem(case, rank)
    module = student_call(cls, fc1, fc2)
    x.requires_grad_(True)
    with profile(activities=[ProfilerActivity.CPU]) as forward_prof:
        y = student_call(module, x)
    if uses_dtensor(module, y):
        return {"forbidden": True}
    y = student_call(checked_output, y, case)
    upstream = upstream_after_gate(case, ask_gate("between forward and backward", y.detach()), upstream)
    with profile(activities=[ProfilerActivity.CPU]) as backward_prof:
        student_call((y * upstream).sum().backward)
    if case["measure_traffic"]:  # large: a fingerprint of the results, their sketches, and the counts (feedback)
        # x.grad under the gate's upstream gradient: its own key, which the localiser leaves out (another seed in
        # every run, so never comparable with the reference's; the launcher's recomputation is its truth)
        return {"output": float32_data(y[:FINGERPRINT_ROWS]),
                SEEDED_X_GRAD: None if x.grad is None else float32_data(x.grad[:FINGERPRINT_ROWS]),
                "sketch": {"output": sketch(y, case["seed"]), SEEDED_X_GRAD: None if x.grad is None else
                           sketch(x.grad, case["seed"])},
                "forward": collective_counts(forward_prof), "backward": collective_counts(backward_prof)}
    shards = find_shards(module, case)
    return {"output": tensor_data(y), "x_grad": None if x.grad is None else tensor_data(x.grad),
            "shards": {role: None if p is None else
                       {"value": tensor_data(p), "grad": None if p.grad is None else tensor_data(p.grad)}
                       for role, p in shards.items()},
            "forward": collective_counts(forward_prof), "backward": collective_counts(backward_prof)}


def expected_passes(case: dict):
    """The launcher's recomputation (meter.GatePolicy.expect): the single-process MLP's output digest, which each
    rank reports at its one gate, and x.grad's first rows and sketch under the upstream gradient the gate's seed drew
    (the same for every rank), which the backward's evidence is compared with."""
    def expect(seeds: list[list[int]]) -> dict:
        fc1, fc2, x, upstream = make_problem(case)
        x.requires_grad_(True)
        y = fc2(nn.functional.gelu(fc1(x)))
        answered = {tuple(s) for s in seeds if s}
        grads = {}
        for rank_seeds in answered:  # shared: one seed for every rank, so one backward serves them all
            (g,) = torch.autograd.grad((y * upstream_after_gate(case, rank_seeds[0], upstream)).sum(), x,
                                       retain_graph=True)
            grads[rank_seeds] = {"rows": float32_data(g[:FINGERPRINT_ROWS]), "sketch": sketch(g, case["seed"])}
        return {"digests": [[digest(y.detach())] for _ in seeds],
                "x_grad": [grads.get(tuple(s)) for s in seeds]}
    return in_launcher(expect)


def gates_of(case: dict):
    """The traffic scenario: one gate between the passes, every rank held until all are there, one seed for all."""
    if not case["measure_traffic"]:
        return None
    return StopAllAtGates(case["world_size"], gates=1, expect=expected_passes(case), shared=True)


def observe(fn, *, salt: int = 0) -> dict:
    return observe_on_ranks(salt, cases(salt), tensor_parallel_rank, fn, gates=gates_of, profiler=True)


def traffic_truth(case: dict) -> dict:
    """The traffic scenario's output fingerprint from the single-process MLP: its first rows and a sketch of all of
    them. x.grad's depends on the launcher's seed at the gate: each observation's meter carries its own
    (``expected_passes``)."""
    fc1, fc2, x, _ = make_problem(case)
    with torch.no_grad():
        y = fc2(nn.functional.gelu(fc1(x)))
    return {"output": float32_data(y[:FINGERPRINT_ROWS]), "sketch": {"output": sketch(y, case["seed"])}}


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    result["single"] = {name: single_process(s["case"]) for name, s in result["scenarios"].items()
                        if name != "traffic"}
    result["scenarios"]["traffic"]["truth"] = traffic_truth(result["scenarios"]["traffic"]["case"])
    return result
