"""The known mistakes of ``train_amp`` and their fingerprints in the observations (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/train_amp.py (tests/exercises/test_diagnosis.py).
Many mistakes change how often the optimizer steps, and then a scenario does not parse (its per-step lists have
another length than the reference's): those fingerprints read the raw scenario (``raw_scenario``), defensively.
"""
from ..judging.diagnosis import EVERY, Mistake, raw_scenario
from ..judging.localise import Locate


def _raw(student, key) -> dict:
    data = raw_scenario(student, key)
    if "error" in data:
        raise KeyError(key)
    return data


def _error(student, key) -> str:
    error = raw_scenario(student, key).get("error")
    return error[:300] if isinstance(error, str) else ""


def _updates(student, key) -> list[dict]:
    return [u for u in _raw(student, key)["updates"] if isinstance(u, dict)]


def _act(student, key) -> list:
    return _raw(student, key)["activation_dtypes"]


def _enabled(student, key) -> bool:
    updates = _updates(student, key)
    return bool(updates) and all(u.get("enabled") is True for u in updates)


def torch_cuda_amp(student, reference):
    if _act(student, "fp16_default") == ["torch.float32"] and _updates(student, "fp16_default") \
            and not any(u.get("enabled") for u in _updates(student, "fp16_default")):
        return "on the CPU the Linear layers ran in float32 and your GradScaler was disabled: torch.cuda.amp's defaults"
    return None


def forward_outside_autocast(student, reference):
    if _act(student, "fp16_default") == ["torch.float32"] and _act(student, "bf16") == ["torch.float32"] \
            and _enabled(student, "fp16_default"):
        return "with dtype float16 and with bfloat16 the Linear layers produced float32 outputs"
    return None


def hard_coded_float16(student, reference):
    if _act(student, "bf16") == ["torch.float16"] and reference["scenarios"]["bf16"]["activation_dtypes"] != ["torch.float16"]:
        return "called with dtype=torch.bfloat16, the Linear layers produced float16 outputs"
    return None


def bf16_by_default(student, reference):
    if _act(student, "fp16_default") == ["torch.bfloat16"]:
        return "called without a dtype, the Linear layers produced bfloat16 outputs"
    return None


def model_half_instead_of_autocast(student, reference):
    if _raw(student, "fp16_default")["param_dtypes"] == ["torch.float16"]:
        return "after training the parameters themselves are float16"
    return None


def scaler_without_device_type(student, reference):
    updates = _updates(student, "fp16_default")
    if _act(student, "fp16_default") == ["torch.float16"] and updates and not any(u.get("enabled") for u in updates):
        return "your GradScaler was disabled while the forward pass ran in float16"
    return None


def no_scaler_in_fp16(student, reference):
    data = _raw(student, "fp16_default")
    if not data["updates"] and data["param_dtypes"] == ["torch.float32"] and data["steps"]:
        return "in float16 the optimizer stepped, but no GradScaler was ever updated"
    return None


def loss_not_scaled(student, reference):
    if "Attempted unscale_" in _error(student, "fp16_default"):
        return "GradScaler refused to step: it had scaled no loss in this iteration"
    return None


def gradients_reach_the_parameters(student, reference) -> bool:
    """Without a scaler (bfloat16) the first step moves the parameters: backward does run."""
    return any(x != 0 for x in _raw(student, "bf16")["first_update"])


def optimizer_step_instead_of_scaler_step(student, reference):
    got, want = _raw(student, "fp16_overflow")["steps"], reference["scenarios"]["fp16_overflow"]["steps"]
    scaling = _enabled(student, "fp16_overflow") and _act(student, "fp16_overflow") == ["torch.float16"]
    if scaling and got == want + 1 and _raw(student, "fp16_default")["steps"] == reference["scenarios"]["fp16_default"]["steps"]:
        return f"when one fp16 batch overflows, the optimizer still stepped {got} times, the overflowing batch included"
    return None


def steps_twice(student, reference):
    got, want = _raw(student, "bf16")["steps"], reference["scenarios"]["bf16"]["steps"]
    if got == 2 * want:
        return f"with {want} batches the optimizer stepped {got} times: twice per batch"
    return None


def new_scaler_every_batch(student, reference):
    scalers = {u.get("scaler") for u in _updates(student, "fp16_default")}
    if len(scalers) > 1:
        return f"{len(scalers)} different GradScalers were updated in one epoch"
    return None


def no_scaler_argument(student, reference):
    error = _error(student, "given_scaler")
    if "unexpected keyword argument" in error and "scaler" in error:
        return "calling it with scaler= raised TypeError: your function has no scaler parameter"
    return None


def ignores_the_given_scaler(student, reference):
    data = _raw(student, "given_scaler")
    if data["other_updates"] and not any(data["given_scales"]):
        return "the GradScaler passed as scaler= was never updated; a scaler of your own was"
    return None


def update_once_after_the_loop(student, reference):
    if "has already been called since the last update" in _error(student, "fp16_default"):
        return "GradScaler refused a second step before an update()"
    return None


def never_zeroes_gradients(student, reference):
    stale = _raw(student, "bf16")["stale_grads_at_backward"]
    if isinstance(stale, list) and stale and not stale[0] and all(stale[1:]):
        return "from the second batch on, the previous batch's gradients were still in .grad at backward()"
    return None


def forgets_train_mode(student, reference):
    data = _raw(student, "eval_dropout")
    if data["training"] is False:
        return "a model that arrived in eval mode was still in eval mode after your function"
    return None


def returns_nothing(student, reference):
    if _raw(student, "fp16_default")["returned_type"] == "NoneType":
        return "your function returned None"
    return None


def returns_a_copy(student, reference):
    data = _raw(student, "fp16_default")
    if data["returned_model"] is False and data["returned_type"] == reference["scenarios"]["fp16_default"]["returned_type"]:
        return "your function returned another model object than the one it was given"
    return None


def _norms(student, reference):
    norms = _raw(student, "fp16_clipped")["step_grad_norms"]
    return [float(n) for n in norms], reference["scenarios"]["fp16_clipped"]["case"]["max_norm"]


def clips_before_unscaling(student, reference):
    norms, max_norm = _norms(student, reference)
    if norms and max(norms) < 0.5 * max_norm:
        return f"with max_norm={max_norm:g} every step's gradient norm was far below max_norm ({max(norms):.2g})"
    return None


def never_clips(student, reference):
    norms, max_norm = _norms(student, reference)
    if norms and min(norms) > 1.01 * max_norm:
        return f"with max_norm={max_norm:g} every step used a gradient norm above it (up to {max(norms):.2g})"
    return None


def nothing_clipped(student, reference) -> bool:
    """Never clipping leaves every part of the gradient as large as it came: some element and some one parameter's
    norm above max_norm too (a clip by value, or per parameter, bounds those), and the first step's norm, from the
    same weights and batch as the reference's, at least the clipped one in every scenario (a smaller clip is not
    'never')."""
    parts, max_norm = _raw(student, "fp16_clipped")["step_grad_parts"], reference["scenarios"]["fp16_clipped"]["case"]["max_norm"]
    firsts = [(_raw(student, k)["step_grad_norms"][0], v["step_grad_norms"][0])
              for k, v in reference["scenarios"].items() if v.get("step_grad_norms")]
    return (max(p[0] for p in parts) > max_norm and max(p[1] for p in parts) > max_norm
            and all(got >= 0.999 * want for got, want in firsts))


def no_max_norm_argument(student, reference):
    error = _error(student, "fp16_clipped")
    if "unexpected keyword argument" in error and "max_norm" in error:
        return "calling it with max_norm= raised TypeError: your function has no max_norm parameter"
    return None


def untrained(student, reference):
    if all(_raw(student, key)["steps"] == 0 for key in ("fp16_default", "bf16")) \
            and _raw(student, "fp16_default")["returned_model"]:
        return "the optimizer never stepped: the model came back untrained"
    return None


MISTAKES = [
    Mistake("clips_before_unscaling", "You clip the gradient norm while the gradients are still multiplied by the "
            "loss scale.", "The scaled norm is S times the true one, so clipping shrinks the true gradients by about S.",
            "Unscale the gradients through the scaler (its unscale_ method) first, then clip, then step through the scaler.",
            clips_before_unscaling, variants=("clips_before_unscaling_then_unscales",)),
    Mistake("never_clips", "You never clip the gradient norm.", "max_norm bounds each step's gradient norm.",
            "After unscaling through the scaler, clip the gradient norm of all parameters to max_norm (clip_grad_norm_).",
            never_clips, requires=nothing_clipped),
    Mistake("no_max_norm_argument", "Your function has no max_norm parameter.",
            "The contract's signature takes max_norm (default 1.0) and clips to it.",
            "Add max_norm=1.0 to the parameters and clip to it.", no_max_norm_argument,
            explains=("clips the gradient norm",),
            variants=("seed_torch_cuda_amp", "autocast_on_the_loss_only", "model_half_instead_of_autocast",
                      "no_scaler_in_fp16", "new_scaler_every_batch",
                      "no_scaler_argument", "update_once_after_the_loop")),
    Mistake("torch_cuda_amp", "You use torch.cuda.amp's autocast() and GradScaler().",
            "Their defaults are for CUDA: on another device autocast does nothing and the scaler is disabled.",
            "Use torch.autocast and torch.amp.GradScaler, each given the model's device type (and autocast the dtype).",
            torch_cuda_amp,
            variants=("seed_torch_cuda_amp",), includes=("scaler_without_device_type",)),
    Mistake("forward_outside_autocast", "Your model's forward pass does not run under autocast.",
            "Only what runs inside the autocast context is computed in low precision.",
            "Run the forward pass and the loss inside a torch.autocast context for the device type and the dtype argument.",
            forward_outside_autocast, variants=("no_autocast", "autocast_on_the_loss_only")),
    Mistake("hard_coded_float16", "You pass dtype=torch.float16 to autocast whatever the dtype argument is.",
            "A caller asking for bfloat16 then trains in float16.", "Pass the dtype argument on to torch.autocast.",
            hard_coded_float16),
    Mistake("bf16_by_default", "Your dtype defaults to bfloat16.", "The contract's default is float16, with a GradScaler.",
            "Make dtype=torch.float16 the default.", bf16_by_default),
    Mistake("model_half_instead_of_autocast", "You cast the model to the low-precision dtype (model.half() / .to(dtype)).",
            "Then the weights themselves are float16: small updates round away, and no fp32 master weights remain.",
            "Keep the model in float32 and let torch.autocast cast copies per operation.", model_half_instead_of_autocast,
            includes=("no_scaler_in_fp16",)),
    Mistake("scaler_without_device_type", "You create torch.amp.GradScaler() without a device type.",
            "It defaults to 'cuda' and is disabled on another device: no loss scaling, no overflow skipping.",
            "Create torch.amp.GradScaler(device.type).", scaler_without_device_type),
    Mistake("no_scaler_in_fp16", "You train in float16 without a GradScaler.",
            "Small fp16 gradients underflow to zero and overflowing steps are not skipped.",
            "Scale the loss with a GradScaler before backward, step through the scaler, and update it after each step.",
            no_scaler_in_fp16),
    Mistake("loss_not_scaled", "You call backward() on the loss itself, not on the scaler's scaled loss.",
            "The scaler then has nothing to unscale and refuses to step.",
            "Call backward() on what scaler.scale returns for the loss.", loss_not_scaled,
            requires=gradients_reach_the_parameters),
    Mistake("optimizer_step_instead_of_scaler_step", "You call optimizer.step() instead of scaler.step(optimizer).",
            "Only scaler.step skips a step whose gradients overflowed; optimizer.step applies inf/NaN updates.",
            "Step through the scaler: scaler.step(optimizer), then scaler.update().", optimizer_step_instead_of_scaler_step),
    Mistake("steps_twice", "You call both scaler.step(optimizer) and optimizer.step().",
            "Each batch then updates the parameters twice.", "Call only scaler.step(optimizer).", steps_twice),
    Mistake("new_scaler_every_batch", "You create a new GradScaler inside the loop.",
            "A scaler learns its scale over many steps; a new one each batch forgets it.",
            "Create one scaler before the loop (when none is passed in).", new_scaler_every_batch),
    Mistake("no_scaler_argument", "Your function has no scaler parameter.",
            "The caller passes its GradScaler so the scale carries over from epoch to epoch.",
            "Add scaler=None and use the given scaler when there is one.", no_scaler_argument),
    Mistake("ignores_the_given_scaler", "You create a GradScaler of your own even when one is passed as scaler=.",
            "The given scaler's state (its scale, its count of clean steps) then never carries over.",
            "Use `scaler` when it is not None; create one only when it is None.", ignores_the_given_scaler,
            explains=("passed as scaler=",),
            variants=("copies_the_given_scale_into_a_new_scaler", "seed_torch_cuda_amp", "new_scaler_every_batch")),
    Mistake("update_once_after_the_loop", "You call scaler.update() once, after the loop.",
            "Every scaler.step needs its own update before the next step.",
            "Call scaler.update() right after each scaler.step(optimizer).", update_once_after_the_loop),
    Mistake("never_zeroes_gradients", "You never zero the gradients.", "backward() adds into .grad, so every step "
            "also applies all earlier batches' gradients.", "Call optimizer.zero_grad() every batch.",
            never_zeroes_gradients),
    Mistake("forgets_train_mode", "You never call model.train().",
            "A model that arrives in eval mode then trains with dropout switched off.",
            "Call model.train() before the loop.", forgets_train_mode, explains=("training mode",)),
    Mistake("returns_nothing", "Your function returns nothing.", "The contract returns the trained model.",
            "End with `return model`.", returns_nothing, explains=("Returns the model",)),
    Mistake("returns_a_copy", "You return a copy of the model.", "The caller's model is the one trained; a copy "
            "costs memory and is not what the contract returns.", "Return the model you were given.", returns_a_copy,
            explains=("Returns the model",)),
    Mistake("untrained", "Your function returns the model without training it.", "Nothing in it runs the batches.",
            "Write the training loop the docstring describes.", untrained, includes=EVERY,
            variants=("returns_the_model_untrained",)),
]


# What the observed values are called in the exercise, and the factors a plausible mistake scales them by.
LOCATE = Locate(names={"params": "the parameters after training", "first_update": "the first update of the parameters",
                       "step_grad_norms": "the gradient norms",
                       "step_grad_parts": "the largest gradient element and one-parameter gradient norm",
                       "steps": "the number of optimizer steps",
                       "updates": "{}", "scale": "the loss scale", "scaler": "the scaler used",
                       "enabled": "the scaler being enabled",
                       "training": "the model's training mode", "dropout_active": "dropout being active",
                       "activation_dtypes": "the activations' dtypes", "param_dtypes": "the parameters' dtypes",
                       "returned_model": "the returned model", "returned_type": "the returned type",
                       "stale_grads_at_backward": "stale gradients at backward", "given_scales": "the given scaler's scales"},
                positions={"step_grad_parts": "step {n}"}, by_position=(*Locate().by_position, "step_grad_parts"),
                factors=lambda case: {"the number of batches": case["n_batches"]})
