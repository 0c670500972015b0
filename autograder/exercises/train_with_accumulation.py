"""Lesson 1 exercise: ``train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4)``.

Observed on tiny seeded problems (a 2-layer MLP on random data, 4 samples a batch):
what the function returns, how often the optimizer steps, the gradient each step
applies, the final parameters, and how many batches' autograd graphs stay alive.
"""
import weakref

import torch
from torch.utils.data import DataLoader, TensorDataset

from ..exercise import (
    Check,
    Exercise,
    case,
    close,
    observation,
    off_by,
    parallel,
    params_data,
    salted_seed,
    scenario,
    tensor_data,
    what,
)

IN, HIDDEN, OUT, BATCH = 8, 16, 4, 4
ATOL = 1e-5  # float32 round-off between valid styles (e.g. dividing the loss or the gradient)


# ---- the problems -------------------------------------------------------------------------

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


DEFAULT_K = 4  # the function's default accumulation_steps
SCENARIOS = {  # name: (n_batches, k, what it is, options); k=None calls with the default
    "default": (8, None, "called with the default accumulation_steps", {}),
    "k1": (6, 1, "called with accumulation_steps=1", {}),
    "k2": (8, 2, "called with accumulation_steps=2", {}),
    "k3": (9, 3, "called with accumulation_steps=3", {}),
    "momentum": (8, 4, "training with SGD with momentum", {"momentum": 0.9}),
    "partial": (10, 4, "the number of batches is not a multiple of accumulation_steps", {}),
    "eval_dropout": (8, 2, "the model (with dropout) arrived in eval mode", {"dropout": True, "eval_first": True}),
    "stale": (8, 4, "the model arrived with gradients left over from earlier", {"stale_grads": True}),
}


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs; the seeds are public for salt 0 and held out for any other salt."""
    return {name: {"what": what, "n_batches": n, "k": k, "seed": salted_seed(i, salt), "dropout": False,
                   "momentum": 0.0, "eval_first": False, "stale_grads": False, **options}
            for i, (name, (n, k, what, options)) in enumerate(SCENARIOS.items())}


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


# ---- the checks ----------------------------------------------------------------------------

def first_step_is_genuine(got: dict, want: dict) -> str | None:
    """The evidence: the first optimizer step's gradient points the reference's way. Only training on the
    scenario's seeded data gives it, so a count or a flag of the same scenario is then believed."""
    if got["step_grads"] and parallel(got["step_grads"][0], want["step_grads"][0]):
        return None
    k = want["case"]["k"] or DEFAULT_K
    return (f"with accumulation_steps={k} your first optimizer step does not use the gradient of the first {k} "
            "batches: call backward() on every micro-batch and step after the k-th.")


def check_return(student, reference):
    got, want = scenario(student, "default", what(reference, "default")), reference["scenarios"]["default"]
    if got["returned_has_graph"]:
        return ("You return a tensor that is still attached to the autograd graph: accumulate `loss.item()` "
                "(a Python float), not the loss tensor.")
    if not got["returned_is_float"]:
        return f"Return a Python float (the mean loss per batch); your function returned a {got['returned_type']}."
    if not close([got["returned"]], [want["returned"]], atol=1e-6, rtol=1e-5):
        return (f"The returned mean loss, {got['returned']:.2g}, is {off_by(got['returned'], want['returned'])}: "
                "add `loss.item() * accumulation_steps` (the unscaled loss) each batch and divide by "
                "len(dataloader).")
    return None


def check_step_timing(student, reference):
    for key in ("default", "k1", "k2", "k3"):
        c = case(reference, key)
        k = c["k"] or DEFAULT_K
        got, want = scenario(student, key, c["what"]), reference["scenarios"][key]
        if got["steps"] != want["steps"]:
            hint = " Use the accumulation_steps argument, not a fixed number." if c["k"] else ""
            return (f"With accumulation_steps={k} and {c['n_batches']} batches the optimizer should step "
                    f"{want['steps']} times; yours stepped {got['steps']} times.{hint}")
    return None


def check_window_gradient(student, reference):
    for key in ("k2", "default"):
        k = case(reference, key)["k"] or DEFAULT_K
        got, want = scenario(student, key, what(reference, key)), reference["scenarios"][key]
        if got["steps"] != want["steps"]:
            return "The optimizer does not step once per window, so the applied gradients cannot be compared."
        for i, (g, w) in enumerate(zip(got["step_grads"], want["step_grads"])):
            if close(g, [k * v for v in w], atol=ATOL):
                return (f"At optimizer step {i + 1} the gradient is {k} times the expected one: divide each "
                        "micro-batch's loss by accumulation_steps before backward().")
            if not close(g, w, atol=ATOL):
                return (f"At optimizer step {i + 1} the gradient differs from the average over the window: "
                        "zero the gradients after each step (and once at the start), and call backward() on "
                        "every micro-batch.")
    return None


def check_final_params(student, reference):
    for key in ("k1", "k2", "default", "momentum"):
        c = case(reference, key)
        got = scenario(student, key, c["what"])
        if not close(got["params"], reference["scenarios"][key]["params"], atol=ATOL):
            setting = "SGD with momentum" if c["momentum"] else f"accumulation_steps={c['k'] or DEFAULT_K}"
            return f"After one epoch with {setting} the model's parameters differ from the reference solution's."
    return None


def check_partial_window(student, reference):
    c = case(reference, "partial")
    n, k = c["n_batches"], c["k"] or DEFAULT_K
    got = scenario(student, "partial", c["what"])
    if any(close(got["params"], ok, atol=ATOL) for ok in reference["partial_accepted"]):
        return None
    return (f"With {n} batches and accumulation_steps={k} the parameters match neither choice for the last "
            f"{n % k} batches: drop them (no step) or flush them with one final optimizer step.")


def check_train_mode(student, reference):
    got = scenario(student, "eval_dropout", what(reference, "eval_dropout"))
    if not got["training"]:
        return "Your function leaves a model that arrived in eval mode in eval mode: call model.train() first."
    if not close(got["params"], reference["scenarios"]["eval_dropout"]["params"], atol=ATOL):
        return "With a dropout model that arrived in eval mode the parameters differ: call model.train() first."
    return None


def check_stale_gradients(student, reference):
    got = scenario(student, "stale", what(reference, "stale"))
    if not close(got["params"], reference["scenarios"]["stale"]["params"], atol=ATOL):
        return ("Gradients left in the model from before the call leak into your first step: "
                "call optimizer.zero_grad() before the first batch.")
    return None


def check_no_graphs_kept(student, reference):
    got, want = scenario(student, "default", what(reference, "default")), reference["scenarios"]["default"]
    if got["returned_has_graph"] or got["max_graphs_alive"] > max(1, want["max_graphs_alive"]):
        return (f"Up to {got['max_graphs_alive']} earlier batches' autograd graphs were still alive during the "
                "epoch: keep only `loss.item()` (a float) across batches, never the loss tensor.")
    return None


EXERCISE = Exercise(
    name="train_with_accumulation",
    notebook="01_gradient_accumulation.ipynb",
    observe=observe,
    observe_reference=observe_reference,
    evidence=first_step_is_genuine,
    checks=[
        Check("Returns the mean unscaled loss per batch as a Python float", 1, check_return, evidence=("default",)),
        Check("Steps once every accumulation_steps batches (k = 1, 2, 3, 4)", 2, check_step_timing,
              evidence=("default", "k1", "k2", "k3")),
        Check("Each step applies the window's average gradient", 2, check_window_gradient),
        Check("Final parameters match the reference (k = 1, 2, 4; SGD with momentum)", 2, check_final_params),
        Check("Handles a final partial window (dropped or flushed)", 1, check_partial_window),
        Check("Puts the model in training mode", 1, check_train_mode),
        Check("Clears gradients left from before the call", 1, check_stale_gradients),
        Check("Keeps no autograd graph alive across batches", 1, check_no_graphs_kept, evidence=("default",)),
    ],
)
