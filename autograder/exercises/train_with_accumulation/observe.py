"""Observing ``train_with_accumulation`` next to the student's code: tiny seeded problems, plain data out."""
import weakref

import torch
from torch.utils.data import DataLoader, TensorDataset

from ..beside.observing import observation, params_data, tensor_data
from .cases import BATCH, HIDDEN, IN, OUT, cases


def make_problem(n_batches: int, *, seed: int, dropout: bool = False, momentum: float = 0.0, lr: float = 0.5):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh()]
    if dropout:
        layers.append(torch.nn.Dropout(0.3))
    layers.append(torch.nn.Linear(HIDDEN, OUT))
    model = torch.nn.Sequential(*layers)
    x = torch.randn(n_batches * BATCH, IN)
    y = torch.randint(0, OUT, (n_batches * BATCH,))
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    return model, loader, optimizer


class _GraphSentinel:
    """Lives exactly as long as the autograd graph of one loss (see _TrackGraph)."""


class _TrackGraph(torch.autograd.Function):
    """Identity on the loss that pins a sentinel to the loss's graph node."""

    @staticmethod
    def forward(ctx, loss, sentinel):
        ctx.sentinel = sentinel
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ObservedCriterion:
    """Cross-entropy that counts, at each call, how many earlier batches' graphs are still alive."""

    def __init__(self):
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.graphs = []
        self.max_alive = 0

    def __call__(self, outputs, targets):
        self.max_alive = max(self.max_alive, sum(ref() is not None for ref in self.graphs))
        sentinel = _GraphSentinel()
        self.graphs.append(weakref.ref(sentinel))
        return _TrackGraph.apply(self.loss_fn(outputs, targets), sentinel)


def run_problem(fn, case: dict) -> dict:
    model, loader, optimizer = make_problem(case["n_batches"], seed=case["seed"], dropout=case["dropout"],
                                            momentum=case["momentum"])
    criterion = ObservedCriterion()
    step_grads = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: step_grads.append(
        [v for p in model.parameters() for v in (tensor_data(p.grad) if p.grad is not None else [0.0] * p.numel())]))
    if case["eval_first"]:
        model.eval()
    if case["stale_grads"]:  # gradients left over from earlier work, as after an evaluation pass
        model(torch.randn(3, IN)).pow(2).sum().backward()
    torch.manual_seed(case["seed"] + 1000)  # dropout masks: the same stream for every implementation
    args = (model, loader, optimizer, criterion) + (() if case["k"] is None else (case["k"],))
    returned = fn(*args)
    return {
        "returned_type": type(returned).__name__,
        "returned_is_float": isinstance(returned, float) and not isinstance(returned, bool),
        "returned_has_graph": bool(isinstance(returned, torch.Tensor) and returned.requires_grad),
        "returned": float(returned.detach()) if isinstance(returned, torch.Tensor) and returned.numel() == 1
        else float(returned) if isinstance(returned, (int, float)) else None,
        "steps": len(step_grads),
        "step_grads": step_grads,
        "params": params_data(model),
        "training": model.training,
        "max_graphs_alive": criterion.max_alive,
    }


def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda case: run_problem(fn, case))


# ---- accepted ways to treat the final partial window --------------------------------------

def _flushing(fn, divide_by_window: bool):
    """The reference, followed by one more step on the leftover batches (the other valid choice)."""
    def flushed(model, loader, optimizer, criterion, accumulation_steps=4):
        batches = list(loader)
        full = len(batches) // accumulation_steps * accumulation_steps
        fn(model, batches[:full], optimizer, criterion, accumulation_steps)
        rest = batches[full:]
        model.train()
        optimizer.zero_grad()
        for inputs, targets in rest:
            loss = criterion(model(inputs), targets)
            (loss / (len(rest) if divide_by_window else accumulation_steps)).backward()
        optimizer.step()
        optimizer.zero_grad()
        return 0.0
    return flushed


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    partial = result["scenarios"]["partial"]
    result["partial_accepted"] = [partial["params"]] + [
        run_problem(_flushing(fn, by_window), partial["case"])["params"] for by_window in (False, True)]
    return result
