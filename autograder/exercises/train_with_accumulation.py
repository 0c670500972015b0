"""Lesson 1 exercise: ``train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4)``.

Observed on tiny seeded problems (a 2-layer MLP on random data, 4 samples a batch):
what the function returns, how often the optimizer steps, the gradient each step
applies, the final parameters, and how many batches' autograd graphs stay alive.
"""
import weakref

import torch
from torch.utils.data import DataLoader, TensorDataset

from ..exercise import Check, Exercise, close, parallel, params_data, run_scenario, scenario, tensor_data

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


def run_problem(fn, n_batches: int, k: int | None, *, seed: int, dropout=False, momentum=0.0,
                eval_first=False, stale_grads=False) -> dict:
    model, loader, optimizer = make_problem(n_batches, seed=seed, dropout=dropout, momentum=momentum)
    criterion = ObservedCriterion()
    step_grads = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: step_grads.append(
        [v for p in model.parameters() for v in (tensor_data(p.grad) if p.grad is not None else [0.0] * p.numel())]))
    if eval_first:
        model.eval()
    if stale_grads:  # gradients left over from earlier work, as after an evaluation pass
        model(torch.randn(3, IN)).pow(2).sum().backward()
    torch.manual_seed(seed + 1000)  # dropout masks: the same stream for every implementation
    args = (model, loader, optimizer, criterion) + (() if k is None else (k,))
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


SCENARIOS = {  # name: (n_batches, k, options); k=None calls with the default
    "default": (8, None, {}),
    "k1": (6, 1, {}),
    "k2": (8, 2, {}),
    "k3": (9, 3, {}),
    "momentum": (8, 4, {"momentum": 0.9}),
    "partial": (10, 4, {}),
    "eval_dropout": (8, 2, {"dropout": True, "eval_first": True}),
    "stale": (8, 4, {"stale_grads": True}),
}


def observe(fn) -> dict:
    return {"scenarios": {
        name: run_scenario(lambda n=n, k=k, opts=opts, seed=i: run_problem(fn, n, k, seed=seed, **opts))
        for i, (name, (n, k, opts)) in enumerate(SCENARIOS.items())
    }}


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


def observe_reference(fn) -> dict:
    observation = observe(fn)
    n, k, _ = SCENARIOS["partial"]
    seed = list(SCENARIOS).index("partial")
    observation["partial_accepted"] = [observation["scenarios"]["partial"]["params"]] + [
        run_problem(_flushing(fn, by_window), n, k, seed=seed)["params"] for by_window in (False, True)]
    return observation


# ---- the checks ----------------------------------------------------------------------------

def check_return(student, reference):
    got, want = scenario(student, "default", "called with the default accumulation_steps"), reference["scenarios"]["default"]
    if got["returned_has_graph"]:
        return ("You return a tensor that is still attached to the autograd graph: accumulate `loss.item()` "
                "(a Python float), not the loss tensor.")
    if not got["returned_is_float"]:
        return f"Return a Python float (the mean loss per batch); your function returned a {got['returned_type']}."
    if not close([got["returned"]], [want["returned"]], atol=1e-6, rtol=1e-5):
        return (f"The returned mean loss is {got['returned']:.6f}, expected {want['returned']:.6f}: add "
                "`loss.item() * accumulation_steps` (the unscaled loss) each batch and divide by len(dataloader).")
    return None


def first_step_is_genuine(got: dict, want: dict) -> bool:
    """Data evidence that the function really trained: its first step's gradient points the reference's way."""
    return bool(got["step_grads"]) and parallel(got["step_grads"][0], want["step_grads"][0])


def check_step_timing(student, reference):
    for key in ("default", "k1", "k2", "k3"):
        n, k, _ = SCENARIOS[key]
        k = k or 4
        got, want = scenario(student, key, f"called with accumulation_steps={k}"), reference["scenarios"][key]
        if got["steps"] != want["steps"]:
            hint = " Use the accumulation_steps argument, not a fixed number." if key != "default" else ""
            return (f"With accumulation_steps={k} and {n} batches the optimizer should step {want['steps']} "
                    f"times; yours stepped {got['steps']} times.{hint}")
        if not first_step_is_genuine(got, want):
            return (f"With accumulation_steps={k} the first optimizer step does not use the gradient of the first "
                    f"{k} batches: call backward() on every micro-batch and step after the k-th.")
    return None


def check_window_gradient(student, reference):
    for key in ("k2", "default"):
        got, want = scenario(student, key, "accumulating gradients"), reference["scenarios"][key]
        if got["steps"] != want["steps"]:
            return "The optimizer does not step once per window, so the applied gradients cannot be compared."
        for i, (g, w) in enumerate(zip(got["step_grads"], want["step_grads"])):
            if close(g, [2 * v for v in w], atol=ATOL) or close(g, [v * 4 for v in w], atol=ATOL):
                return (f"At optimizer step {i + 1} the gradient is a multiple of the expected one: divide each "
                        "micro-batch's loss by accumulation_steps before backward().")
            if not close(g, w, atol=ATOL):
                return (f"At optimizer step {i + 1} the gradient differs from the average over the window: "
                        "zero the gradients after each step (and once at the start), and call backward() on "
                        "every micro-batch.")
    return None


def check_final_params(student, reference):
    for key, what in (("k1", "accumulation_steps=1"), ("k2", "accumulation_steps=2"),
                      ("default", "accumulation_steps=4"), ("momentum", "SGD with momentum")):
        got = scenario(student, key, f"trained with {what}")
        if not close(got["params"], reference["scenarios"][key]["params"], atol=ATOL):
            return f"After one epoch with {what} the model's parameters differ from the reference solution's."
    return None


def check_partial_window(student, reference):
    got = scenario(student, "partial", "the number of batches is not a multiple of accumulation_steps")
    if any(close(got["params"], ok, atol=ATOL) for ok in reference["partial_accepted"]):
        return None
    return ("With 10 batches and accumulation_steps=4 the parameters match neither choice for the last 2 "
            "batches: drop them (no step) or flush them with one final optimizer step.")


def check_train_mode(student, reference):
    got = scenario(student, "eval_dropout", "the model (with dropout) started in eval mode")
    if not got["training"]:
        return "Your function leaves a model that arrived in eval mode in eval mode: call model.train() first."
    if not close(got["params"], reference["scenarios"]["eval_dropout"]["params"], atol=ATOL):
        return "With a dropout model that arrived in eval mode the parameters differ: call model.train() first."
    return None


def check_stale_gradients(student, reference):
    got = scenario(student, "stale", "the model arrived with gradients left over from earlier")
    if not close(got["params"], reference["scenarios"]["stale"]["params"], atol=ATOL):
        return ("Gradients left in the model from before the call leak into your first step: "
                "call optimizer.zero_grad() before the first batch.")
    return None


def check_no_graphs_kept(student, reference):
    got, want = scenario(student, "default", "called with the default accumulation_steps"), reference["scenarios"]["default"]
    if got["returned_has_graph"] or got["max_graphs_alive"] > max(1, want["max_graphs_alive"]):
        return (f"Up to {got['max_graphs_alive']} earlier batches' autograd graphs were still alive during the "
                "epoch: keep only `loss.item()` (a float) across batches, never the loss tensor.")
    if not first_step_is_genuine(got, want):
        return "This could not be confirmed: your first optimizer step does not use the first window's gradient."
    return None


EXERCISE = Exercise(
    name="train_with_accumulation",
    notebook="01_gradient_accumulation.ipynb",
    observe=observe,
    observe_reference=observe_reference,
    checks=[
        Check("Returns the mean unscaled loss per batch as a Python float", 1, check_return),
        Check("Steps once every accumulation_steps batches (k = 1, 2, 3, 4)", 2, check_step_timing),
        Check("Each step applies the window's average gradient", 2, check_window_gradient),
        Check("Final parameters match the reference (k = 1, 2, 4; SGD with momentum)", 2, check_final_params),
        Check("Handles a final partial window (dropped or flushed)", 1, check_partial_window),
        Check("Puts the model in training mode", 1, check_train_mode),
        Check("Clears gradients left from before the call", 1, check_stale_gradients),
        Check("Keeps no autograd graph alive across batches", 1, check_no_graphs_kept),
    ],
)
