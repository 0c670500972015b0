"""Lesson 2 exercise: ``train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None) -> model``.

Observed on tiny seeded problems (a 2-layer MLP on random data, 4 samples a batch), on the CPU and,
when the grader has one, on a CUDA GPU: what the function returns, the model's mode, the dtype of
every Linear layer's output inside the forward (is autocast in effect, in the requested dtype?),
the parameters' dtype afterwards (fp32 master weights), how many optimizer steps really happen
(``GradScaler.step`` skips ``optimizer.step`` when a gradient overflowed), whether ``.grad`` still
holds the previous batch's gradient when each backward pass starts, the final parameters, and
every ``GradScaler.update`` call with the scale after it. One scenario passes a GradScaler of the
grader's own (``scaler=``) and calls the function twice, as a training loop calls it once per epoch:
that scaler must be the one updated, and its scale must carry over from the first call to the second.
Another passes a ``max_norm`` below every batch's gradient norm, so that every step clips: the gradient norm
each real optimizer step sees (a pre-hook) must be ``max_norm`` — not the larger true norm (no clipping), and not
``max_norm / S`` (the gradients clipped while still multiplied by the loss scale S, before ``scaler.unscale_``).

Watching ``GradScaler.update`` means wrapping the class's method while the scenario runs. That is
grader code, restored afterwards; the student's scaler is created inside their function, so this is
the one place its scale can be seen.
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

from ..exercise import (
    Check,
    Exercise,
    case,
    close,
    observation,
    parallel,
    params_data,
    salted_seed,
    scenario,
    scenario_keys,
    what,
)

IN, HIDDEN, OUT, BATCH, N_BATCHES = 8, 16, 4, 4, 6
OVERFLOW_BATCH = 2   # this batch's inputs are 100x larger: its scaled fp16 gradients overflow
OUTLIER = 100.0
# Valid styles run the same low-precision ops, so on one device their results agree exactly (measured);
# 2e-5 leaves room for a different summation order on a GPU while staying well below the gap between an
# fp16 and an fp32 epoch of the default scenario (1.2e-4), let alone a wrong update (1e-2 and more).
ATOL = 2e-5
CLIP_NORM = 0.01  # below the gradient norm of every batch of every seed's problem: every step clips (measured)


# ---- the problems -------------------------------------------------------------------------

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
    steps, norms = [], []  # a pre-hook sees only real steps: GradScaler.step skips optimizer.step on inf/NaN

    def before_step(opt, args, kwargs):  # returns None: a value would replace the step's arguments
        steps.append(1)
        norms.append(grad_norm(model))

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
        "stale_grads_at_backward": criterion.stale,
        "params": params_data(model),
        "first_update": [a - b for a, b in zip(after_first_step[0], initial)] if after_first_step else [],
        "updates": scalers.calls,  # scalers numbered in order of first use
    }


def grad_norm(model) -> float:
    """The norm of all gradients together, as clip_grad_norm_ computes it."""
    grads = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


# The given scaler starts too high for this model's fp16 gradients (so its first steps overflow and are
# skipped) and grows after every GIVEN_GROWTH clean steps: its scale moves in both epochs, and the second
# epoch's start depends on where the first left it.
GIVEN_INIT_SCALE, GIVEN_GROWTH, GIVEN_EPOCHS = 2.0**20, 2, 2


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


SCENARIOS = {  # name: (what it is, options); dtype None calls with the default
    "fp16_default": ("called with the default dtype", {}),
    "bf16": ("called with dtype=torch.bfloat16", {"dtype": "bfloat16"}),
    "fp16_overflow": ("one fp16 batch overflows", {"dtype": "float16", "outlier_batch": OVERFLOW_BATCH}),
    "eval_dropout": ("the model (with dropout) arrived in eval mode",
                     {"dtype": "bfloat16", "dropout": True, "eval_first": True}),
    "given_scaler": ("called once per epoch for two epochs with one GradScaler passed as scaler=",
                     {"dtype": "float16", "given_scaler": True, "init_scale": GIVEN_INIT_SCALE,
                      "growth_interval": GIVEN_GROWTH, "epochs": GIVEN_EPOCHS}),
    "fp16_clipped": (f"called with max_norm={CLIP_NORM}, below every batch's gradient norm", {"dtype": "float16",
                                                                                         "max_norm": CLIP_NORM}),
}
ON_CUDA = ("fp16_default", "bf16", "fp16_overflow", "fp16_clipped")  # also observed on a GPU when the grader has one


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs, on the CPU and (some) on a GPU if there is one (key ``name@cuda``); the seeds
    are public for salt 0 and held out for any other salt."""
    found = {}
    for device in devices():
        for i, (name, (words, options)) in enumerate(SCENARIOS.items()):
            if device != "cpu" and (name not in ON_CUDA or (options.get("dtype") == "bfloat16"
                                                            and not torch.cuda.is_bf16_supported())):
                continue
            found[name if device == "cpu" else f"{name}@{device}"] = {
                "what": words + ("" if device == "cpu" else f" on {device}"), "device": device,
                "seed": salted_seed(i, salt), "n_batches": N_BATCHES, "dtype": None, "outlier_batch": None,
                "dropout": False, "eval_first": False, **options}
    return found


def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda case: (run_with_given_scaler if case.get("given_scaler")
                                                        else run_problem)(fn, case))


# ---- the checks ----------------------------------------------------------------------------

def first_update_is_genuine(got: dict, want: dict) -> str | None:
    """The evidence: the first optimizer update points the reference's way, which only training on the
    scenario's seeded data gives, so a dtype, flag or count of the same scenario is then believed."""
    if parallel(got["first_update"], want["first_update"], min_cos=0.99):
        return None
    return (f"when {want['case']['what']}, your first optimizer step does not move the parameters the way the "
            "reference's does.")


def _keys(reference, *names):
    """(key, description) of the named scenarios the reference has: the CPU ones, and the GPU ones if any."""
    return [(key, what(reference, key)) for key in scenario_keys(reference, names)]


def check_returns_model(student, reference):
    got = scenario(student, "fp16_default", what(reference, "fp16_default"))
    if not got["returned_model"]:
        if got["returned_type"] == reference["scenarios"]["fp16_default"]["returned_type"]:
            return "Your function returned a different model object (a copy?): return the model it was given."
        return f"Return the model you trained (`return model`); your function returned a {got['returned_type']}."
    return None


def check_train_mode(student, reference):
    got = scenario(student, "eval_dropout", what(reference, "eval_dropout"))
    if not got["dropout_active"] or not got["training"]:
        return ("A model that arrived in eval mode was trained with its dropout switched off: "
                "call model.train() before the loop.")
    return None


def check_autocast(student, reference):
    for key, what_ in _keys(reference, "fp16_default"):
        got, want = scenario(student, key, what_), reference["scenarios"][key]
        if got["param_dtypes"] != want["param_dtypes"]:
            return (f"After training, the parameters are {', '.join(got['param_dtypes'])}: keep the fp32 master "
                    "weights (no model.half()) and let torch.autocast cast copies for each operation.")
        if got["activation_dtypes"] != want["activation_dtypes"]:
            return (f"When {what_}, the Linear layers produced {', '.join(got['activation_dtypes'])} instead of "
                    f"{', '.join(want['activation_dtypes'])}: run the forward pass inside "
                    "`torch.autocast(device_type, dtype=dtype)` with the device type of the model's parameters.")
    return None


def check_honours_dtype(student, reference):
    for key, what_ in _keys(reference, "bf16"):
        got, want = scenario(student, key, what_), reference["scenarios"][key]
        if got["activation_dtypes"] != want["activation_dtypes"]:
            return (f"When {what_}, the Linear layers produced {', '.join(got['activation_dtypes'])} instead of "
                    f"{', '.join(want['activation_dtypes'])}: pass the dtype argument on to torch.autocast.")
    return None


def _params_problem(student, reference, name, advice):
    for key, what_ in _keys(reference, name):
        got, want = scenario(student, key, what_), reference["scenarios"][key]
        if not close(got["params"], want["params"], atol=ATOL):
            return f"When {what_}, the parameters after one epoch differ from the reference solution's: {advice}"
    return None


def check_fp16_params(student, reference):
    return _params_problem(student, reference, "fp16_default",
                           "per batch, zero the gradients, scaler.scale(loss).backward(), scaler.step(optimizer), "
                           "scaler.update().")


def check_bf16_params(student, reference):
    return _params_problem(student, reference, "bf16",
                           "per batch, zero the gradients, run the forward pass under autocast, backward, "
                           "and step the optimizer once.")


def check_overflow(student, reference):
    for key, what_ in _keys(reference, "fp16_overflow"):
        got, want = scenario(student, key, what_), reference["scenarios"][key]
        n, outlier = want["case"]["n_batches"], want["case"]["outlier_batch"]
        if got["steps"] > want["steps"]:
            return (f"When {what_}, the optimizer stepped {got['steps']} times for {n} batches instead of "
                    f"{want['steps']}: the overflowing batch must be skipped, so use a GradScaler for the model's "
                    "device and let scaler.step(optimizer) decide whether to step.")
        if got["steps"] < want["steps"]:
            return (f"When {what_}, the optimizer stepped only {got['steps']} times for {n} batches instead "
                    f"of {want['steps']}: the skipped batch's infinite gradients lingered, so zero the gradients "
                    "every batch.")
        scales = [u["scale"] for u in got["updates"]]
        if len(scales) != n or not scales[outlier] < scales[outlier - 1]:
            return (f"When {what_}, the GradScaler's scale after each update was {scales}; it must drop right after "
                    "the overflowing batch: call scaler.update() after every scaler.step(optimizer).")
        if not close(got["params"], want["params"], atol=ATOL):
            return (f"When {what_}, the overflowing step was skipped but the final parameters differ from the "
                    "reference solution's: zero the gradients, scale the loss, step and update once per batch.")
    return None


def check_one_scaler(student, reference):
    for key, what_ in _keys(reference, "fp16_default", "fp16_overflow"):
        updates, n = scenario(student, key, what_)["updates"], case(reference, key)["n_batches"]
        if not updates:
            return (f"When {what_}, no torch.amp.GradScaler was updated: create one scaler before the loop and "
                    "call scaler.update() after each scaler.step(optimizer).")
        if not all(u["enabled"] for u in updates):
            return (f"When {what_}, your GradScaler was disabled: torch.amp.GradScaler() defaults to device 'cuda', "
                    "so pass the model's device type, torch.amp.GradScaler(device.type).")
        if len({u["scaler"] for u in updates}) > 1:
            return (f"When {what_}, your function made {len({u['scaler'] for u in updates})} GradScalers: create "
                    "one before the loop (when none is passed in), so the scale it learns carries from batch to batch.")
        if len(updates) != n:
            return (f"When {what_}, the GradScaler was updated {len(updates)} times for {n} batches: call "
                    "scaler.update() once per batch, right after scaler.step(optimizer).")
    return None


def check_given_scaler(student, reference):
    key = "given_scaler"
    raw = student.get("scenarios", {}).get(key)
    if isinstance(raw, dict) and "scaler" in str(raw.get("error", "")) and "argument" in str(raw.get("error", "")):
        return ("Your function does not take a scaler argument: add `scaler=None` to its parameters, use the "
                "GradScaler it gives when there is one, and create one only when it is None.")
    got, want = scenario(student, key, what(reference, key)), reference["scenarios"][key]
    n, epochs = case(reference, key)["n_batches"], case(reference, key)["epochs"]
    if not any(got["given_scales"]) or got["other_updates"]:
        return (f"When {what(reference, key)}, your function updated a GradScaler of its own instead of the one it "
                "was given: use `scaler` when it is not None, so that its scale (and its count of clean steps) "
                "carries over from epoch to epoch.")
    if [len(s) for s in got["given_scales"]] != [n] * epochs:
        return (f"When {what(reference, key)}, the given GradScaler was updated {[len(s) for s in got['given_scales']]} "
                f"times per call for {n} batches each: call scaler.update() once per batch.")
    if got["given_scales"] != want["given_scales"]:
        return (f"When {what(reference, key)}, the given GradScaler's scale after each batch differs from the "
                "reference's: scale the loss with it, step and update it every batch, and keep its state "
                "(do not reset or copy it).")
    return None


def check_clipping(student, reference):
    for key, what_ in _keys(reference, "fp16_clipped"):
        got, want = scenario(student, key, what_), reference["scenarios"][key]
        max_norm, norms = case(reference, key)["max_norm"], got["step_grad_norms"]
        if not norms:
            return f"When {what_}, the optimizer never stepped: step it through the scaler, scaler.step(optimizer)."
        if max(norms) > 1.01 * max_norm:
            return (f"When {what_}, the optimizer stepped with a gradient norm of {max(norms):.2g}, above max_norm: "
                    "clip it with torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) before the step.")
        if min(norms) < 0.5 * max_norm:
            return (f"When {what_}, the optimizer stepped with a gradient norm of {min(norms):.2g}, far below "
                    "max_norm: you clipped the gradients while they were still multiplied by the loss scale; call "
                    "scaler.unscale_(optimizer) first, then clip, then scaler.step(optimizer).")
        if not close(got["params"], want["params"], atol=ATOL):
            return (f"When {what_}, the parameters after one epoch differ from the reference solution's: per batch, "
                    "scale and backward, unscale, clip the gradient norm, step through the scaler, update.")
    return None


def check_zero_grad(student, reference):
    for key, what_ in _keys(reference, "bf16", "fp16_default"):
        stale, n = scenario(student, key, what_)["stale_grads_at_backward"], case(reference, key)["n_batches"]
        if len(stale) != n:
            return (f"When {what_}, backward() ran {len(stale)} times for {n} batches: compute the loss "
                    "with the criterion and call backward once per batch.")
        if any(stale):
            return (f"When {what_}, the previous batch's gradients were still in .grad when backward() started "
                    f"on batch {stale.index(True) + 1}: call optimizer.zero_grad() every batch.")
    return None


EXERCISE = Exercise(
    name="train_amp",
    notebook="02_mixed_precision.ipynb",
    observe=observe,
    evidence=first_update_is_genuine,
    checks=[
        Check("Returns the model", 1, check_returns_model, evidence=("fp16_default",)),
        Check("Puts the model in training mode", 1, check_train_mode, evidence=("eval_dropout",)),
        Check("Runs the forward pass under autocast, keeping fp32 master weights (fp16 by default)", 2,
              check_autocast, evidence=("fp16_default",)),
        Check("Honours the dtype argument (bfloat16 activations when asked)", 1, check_honours_dtype,
              evidence=("bf16",)),
        Check("Final parameters match the reference in float16 with a GradScaler", 2, check_fp16_params),
        Check("Final parameters match the reference in bfloat16", 1, check_bf16_params),
        Check("Skips an fp16 step whose gradients overflow, and lowers the scale", 2, check_overflow),
        Check("Keeps one GradScaler and updates it after every step", 1, check_one_scaler,
              evidence=("fp16_default", "fp16_overflow")),
        Check("Uses the GradScaler passed as scaler=, so its scale carries over to the next epoch", 1,
              check_given_scaler, evidence=("given_scaler",)),
        Check("Clears the gradients every batch", 1, check_zero_grad, evidence=("bf16", "fp16_default")),
        Check("Unscales, then clips the gradient norm to max_norm, then steps", 2, check_clipping,
              evidence=("fp16_clipped",)),
    ],
)
