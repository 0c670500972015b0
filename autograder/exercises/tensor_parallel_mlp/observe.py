"""Observing ``TensorParallelMLP`` on real ranks; the grader's own count of collectives."""
import warnings

import torch
from torch import nn

import coursekit  # noqa: F401  keeps the profiler's back end quiet on stderr (KINETO_LOG_LEVEL)

from ..observing import tensor_data
from ..ranks import observe_on_ranks, student_call
from .cases import cases


def make_problem(case: dict):
    """The full layers, the input and the upstream gradient: identical on every rank (same seed)."""
    torch.manual_seed(case["seed"])
    fc1, fc2 = nn.Linear(case["d_in"], case["hidden"]), nn.Linear(case["hidden"], case["d_out"])
    x = torch.randn(case["batch"], case["d_in"])
    upstream = torch.randn(case["batch"], case["d_out"])  # dL/dy: the loss is (y · upstream).sum()
    return fc1, fc2, x, upstream


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

def collectives(prof) -> dict[str, int]:
    """Every gloo collective the profiler saw, by kind: {"all_reduce": 1, ...}."""
    counts: dict[str, int] = {}
    for event in prof.events():
        if event.name.startswith("gloo:"):
            kind = event.name.removeprefix("gloo:")
            counts[kind] = counts.get(kind, 0) + 1
    return counts


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


def tensor_parallel_rank(rank: int, world_size: int, cls, case: dict) -> dict:
    """One rank: build the student's module from the full layers, one forward and one backward, counted."""
    from torch.profiler import ProfilerActivity, profile

    warnings.simplefilter("ignore")  # a rank's warnings would reach the notebook's stderr
    fc1, fc2, x, upstream = make_problem(case)
    module = student_call(cls, fc1, fc2)
    x.requires_grad_(True)
    with profile(activities=[ProfilerActivity.CPU]) as forward_prof:
        y = student_call(module, x)
    if uses_dtensor(module, y):
        return {"forbidden": True}
    y = student_call(checked_output, y, case)
    with profile(activities=[ProfilerActivity.CPU]) as backward_prof:
        student_call((y * upstream).sum().backward)
    shards = find_shards(module, case)
    return {"forbidden": False, "output": tensor_data(y), "x_grad": None if x.grad is None else tensor_data(x.grad),
            "shards": {role: None if p is None else
                       {"value": tensor_data(p), "grad": None if p.grad is None else tensor_data(p.grad)}
                       for role, p in shards.items()},
            "forward": collectives(forward_prof), "backward": collectives(backward_prof)}


def warm_profiler() -> None:
    """The profiler's first start costs about 1.5 s; once here, not in every forked rank."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        torch.zeros(1).add_(1)


def observe(fn, *, salt: int = 0) -> dict:
    warm_profiler()
    return observe_on_ranks(salt, cases(salt), tensor_parallel_rank, fn)


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    result["single"] = {name: single_process(s["case"]) for name, s in result["scenarios"].items()}
    return result
