"""Observing ``train_amp`` next to the student's code: tiny seeded problems on the CPU (and a GPU if any)."""
import torch
from torch.utils.data import DataLoader, TensorDataset

from ..beside.observing import observation, params_data
from .cases import BATCH, HIDDEN, IN, N_BATCHES, OUT, OUTLIER, cases


def make_problem(*, seed: int, device: str, n_batches: int = N_BATCHES, dropout: bool = False,
                 outlier_batch: int | None = None):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU()]
    if dropout:
        layers.append(torch.nn.Dropout(0.3))
    layers.append(torch.nn.Linear(HIDDEN, OUT))
    model = torch.nn.Sequential(*layers).to(device)
    x = torch.randn(n_batches * BATCH, IN)
    y = torch.randint(0, OUT, (n_batches * BATCH,))
    if outlier_batch is not None:
        x[outlier_batch * BATCH:(outlier_batch + 1) * BATCH] *= OUTLIER
    # The data stays on the CPU, as a DataLoader delivers it: the function moves it to the model's device.
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, loader, optimizer


class WatchedScalers:
    """While active, every ``torch.amp.GradScaler.update`` call is recorded: which scaler, its scale after.

    Scalers are numbered in order of first use; a scaler passed as ``given`` is number 0 from the start."""

    def __init__(self, given=None):
        self.calls = []
        self.scalers = [] if given is None else [given]  # kept alive: a new scaler cannot reuse a freed one's id

    def __enter__(self):
        cls = torch.amp.GradScaler
        self.original = cls.__dict__["update"]
        original, calls, scalers = self.original, self.calls, self.scalers

        def update(scaler, *args, **kwargs):
            result = original(scaler, *args, **kwargs)
            if not any(s is scaler for s in scalers):
                scalers.append(scaler)
            calls.append({"scaler": next(i for i, s in enumerate(scalers) if s is scaler),
                          "enabled": bool(scaler.is_enabled()), "scale": float(scaler.get_scale())})
            return result

        cls.update = update
        return self

    def __exit__(self, *exc):
        torch.amp.GradScaler.update = self.original
        return False


class WatchedCriterion:
    """Cross-entropy that notes, as each backward pass starts, whether .grad still holds an earlier batch's gradient."""

    def __init__(self, model):
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.model = model
        self.stale = []

    def __call__(self, outputs, targets):
        loss = self.loss_fn(outputs, targets)
        if loss.requires_grad:  # the hook runs before backward reaches (and adds into) any parameter's .grad
            loss.register_hook(self._backward_starts)
        return loss

    def _backward_starts(self, grad):
        self.stale.append(any(p.grad is not None and bool(p.grad.count_nonzero()) for p in self.model.parameters()))


def run_problem(fn, case: dict) -> dict:
    model, loader, optimizer = make_problem(seed=case["seed"], device=case["device"], n_batches=case["n_batches"],
                                            dropout=case["dropout"], outlier_batch=case["outlier_batch"])
    steps, norms, parts = [], [], []  # a pre-hook sees only real steps: GradScaler.step skips optimizer.step on inf/NaN

    def before_step(opt, args, kwargs):  # returns None: a value would replace the step's arguments
        steps.append(1)
        norms.append(grad_norm(model))
        parts.append(grad_parts(model))

    optimizer.register_step_pre_hook(before_step)
    initial, after_first_step = params_data(model), []
    optimizer.register_step_post_hook(lambda opt, args, kwargs: after_first_step or after_first_step.append(
        params_data(model)))
    activation_dtypes, dropout_modes = set(), []
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            layer.register_forward_hook(lambda mod, inputs, output: activation_dtypes.add(str(output.dtype)))
        if isinstance(layer, torch.nn.Dropout):
            layer.register_forward_hook(lambda mod, inputs, output: dropout_modes.append(mod.training))
    criterion = WatchedCriterion(model)
    if case["eval_first"]:
        model.eval()
    torch.manual_seed(case["seed"] + 1000)  # dropout masks: the same stream for every implementation
    dtype = case["dtype"] and getattr(torch, case["dtype"])
    args = (model, loader, optimizer, criterion) + (() if dtype is None else (dtype,))
    clip = {} if case.get("max_norm") is None else {"max_norm": case["max_norm"]}
    with WatchedScalers() as scalers:
        returned = fn(*args, **clip)
    return {
        "returned_model": returned is model,
        "returned_type": type(returned).__name__,
        "training": model.training,
        "dropout_active": all(dropout_modes) if dropout_modes else None,
        "activation_dtypes": sorted(activation_dtypes),
        "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "steps": len(steps),
        "step_grad_norms": [float(f"{n:.6g}") for n in norms],  # the gradient norm each real step used
        # each step's largest gradient element and largest one-parameter norm: what a clip by value or per parameter
        # bounds, and an unclipped gradient does not (the diagnosis's words only)
        "step_grad_parts": parts,
        "stale_grads_at_backward": criterion.stale,
        "params": params_data(model),
        "first_update": [a - b for a, b in zip(after_first_step[0], initial)] if after_first_step else [],
        "updates": scalers.calls,  # scalers numbered in order of first use
    }


def grad_norm(model) -> float:
    """The norm of all gradients together, as clip_grad_norm_ computes it."""
    grads = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


def grad_parts(model) -> list[float]:
    """[largest |element|, largest one-parameter norm] of the gradients."""
    grads = [p.grad.detach().float() for p in model.parameters() if p.grad is not None]
    return [float(f"{max(float(g.abs().max()) for g in grads):.6g}"),
            float(f"{max(float(g.norm()) for g in grads):.6g}")] if grads else [0.0, 0.0]


def run_with_given_scaler(fn, case: dict) -> dict:
    """Call ``fn`` once per epoch with one GradScaler of the grader's (``scaler=``), as a training loop does."""
    model, loader, optimizer = make_problem(seed=case["seed"], device=case["device"], n_batches=case["n_batches"])
    steps = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: steps.append(1))
    initial, after_first_step = params_data(model), []
    optimizer.register_step_post_hook(lambda opt, args, kwargs: after_first_step or after_first_step.append(
        params_data(model)))
    scaler = torch.amp.GradScaler(case["device"], init_scale=case["init_scale"],
                                  growth_interval=case["growth_interval"])
    epochs = []
    with WatchedScalers(given=scaler) as scalers:
        for _ in range(case["epochs"]):
            before = len(scalers.calls)
            fn(model, loader, optimizer, torch.nn.CrossEntropyLoss(), torch.float16, scaler=scaler)
            epochs.append(scalers.calls[before:])
    return {
        "given_scales": [[u["scale"] for u in epoch if u["scaler"] == 0] for epoch in epochs],
        "other_updates": sum(u["scaler"] != 0 for epoch in epochs for u in epoch),
        "steps": len(steps),
        "params": params_data(model),
        "first_update": [a - b for a, b in zip(after_first_step[0], initial)] if after_first_step else [],
    }


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def observe(fn, *, salt: int = 0) -> dict:
    on_cuda = torch.cuda.is_available()
    found = cases(salt, tuple(devices()), bf16_on_cuda=on_cuda and torch.cuda.is_bf16_supported())
    return observation(salt, found, lambda case: (run_with_given_scaler if case.get("given_scaler")
                                                        else run_problem)(fn, case))
