"""The checks of ``train_amp``: plain Python on the observations (no torch here)."""
from ..judging.checking import case, close, parallel, scenario, scenario_keys, what
from .cases import ATOL


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
