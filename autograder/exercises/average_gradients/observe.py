"""Observing ``average_gradients`` on real ranks: a manual data-parallel loop around the student's call."""
import warnings

import torch
import torch._dynamo  # noqa: F401  torch.optim and DDP import it lazily (3–6 s): here, once, not in every forked rank
from torch import nn

from ..beside.observing import params_data, tensor_data
from ..beside.ranks import observe_on_ranks, run_on_ranks, student_call
from .cases import BATCH, DATA_SEED, HIDDEN, IN, LR, MODEL_SEED, MOMENTUM, OUT, STEPS, WEIGHT_DECAY, cases


class Net(nn.Module):
    """A tiny MLP; optionally with a frozen bias and a layer the forward pass never uses."""

    def __init__(self, with_unused: bool):
        super().__init__()
        self.hidden = nn.Linear(IN, HIDDEN)
        self.out = nn.Linear(HIDDEN, OUT)
        if with_unused:
            self.hidden.bias.requires_grad_(False)   # frozen: its .grad stays None
            self.unused = nn.Linear(HIDDEN, OUT)    # never called: its .grad stays None too

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x)))


def make_problem(world_size: int, with_unused: bool, *, steps: int = STEPS, model_seed: int = MODEL_SEED,
                 data_seed: int = DATA_SEED):
    """Identical on every rank: the same seeds give the same initial weights and the same data."""
    torch.manual_seed(model_seed)
    model = Net(with_unused)
    generator = torch.Generator().manual_seed(data_seed)
    n = steps * BATCH * world_size
    x = torch.randn(n, IN, generator=generator)
    y = torch.randint(0, OUT, (n,), generator=generator)
    return model, x, y


def problem_of(case: dict):
    return make_problem(case["world_size"], case["with_unused"], steps=case["steps"], model_seed=case["model_seed"],
                        data_seed=case["data_seed"])


def make_optimizer(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)


def local_batch(x, y, rank: int, world_size: int, step: int):
    """DistributedSampler's split without shuffling: rank r owns samples r, r+N, r+2N, ..."""
    xs, ys = x[rank::world_size], y[rank::world_size]
    return xs[step * BATCH:(step + 1) * BATCH], ys[step * BATCH:(step + 1) * BATCH]


def _grads(model) -> list:
    return [tensor_data(p.grad) if p.grad is not None else None for p in model.parameters()]


def manual_data_parallel(rank: int, world_size: int, fn, case: dict) -> dict:
    """One rank of the manual loop, recording gradients and parameters around every call of ``fn``."""
    model, x, y = problem_of(case)
    optimizer = make_optimizer(model.parameters())
    calls = []
    for step in range(case["steps"]):
        xb, yb = local_batch(x, y, rank, world_size, step)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(xb), yb).backward()
        call = {"grads_before": _grads(model), "params_before": params_data(model)}
        student_call(fn, model)
        call.update(grads_after=_grads(model), params_after=params_data(model))
        calls.append(call)
        optimizer.step()
    return {"calls": calls, "final": params_data(model)}


def ddp_rank(rank: int, world_size: int, case: dict) -> list[float]:
    """The same training with torch's DistributedDataParallel: the ground truth."""
    warnings.simplefilter("ignore")
    model, x, y = problem_of(case)
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=case["with_unused"])
    optimizer = make_optimizer(ddp.parameters())
    for step in range(case["steps"]):
        xb, yb = local_batch(x, y, rank, world_size, step)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(xb), yb).backward()
        optimizer.step()
    return params_data(model)


def single_process(case: dict) -> list[float]:
    """One process, one batch of world_size × BATCH samples per step (the same samples the ranks share)."""
    model, x, y = problem_of(case)
    optimizer = make_optimizer(model.parameters())
    rows_per_step = BATCH * case["world_size"]
    for step in range(case["steps"]):
        rows = slice(step * rows_per_step, (step + 1) * rows_per_step)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
        optimizer.step()
    return params_data(model)


def observe(fn, *, salt: int = 0) -> dict:
    # no check reads a meter here: scenarios of one world size share a launch
    return observe_on_ranks(salt, cases(salt), manual_data_parallel, fn)


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    result["ddp"], result["single"] = {}, {}
    for name, scenario_ in result["scenarios"].items():
        c = scenario_["case"]
        ddp = run_on_ranks(ddp_rank, c["world_size"], c, timeout=60)
        if "error" in ddp:
            raise RuntimeError(f"DDP itself failed in scenario {name}: {ddp['error']}")
        result["ddp"][name] = ddp["ranks"]
        result["single"][name] = single_process(c)
    return result
