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
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="train_amp",
    notebook="02_mixed_precision.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    evidence=checks.first_update_is_genuine,
    checks=[
        Check("Returns the model", 1, checks.check_returns_model, evidence=("fp16_default",)),
        Check("Puts the model in training mode", 1, checks.check_train_mode, evidence=("eval_dropout",)),
        Check("Runs the forward pass under autocast, keeping fp32 master weights (fp16 by default)", 2,
              checks.check_autocast, evidence=("fp16_default",)),
        Check("Honours the dtype argument (bfloat16 activations when asked)", 1, checks.check_honours_dtype,
              evidence=("bf16",)),
        Check("Final parameters match the reference in float16 with a GradScaler", 2, checks.check_fp16_params),
        Check("Final parameters match the reference in bfloat16", 1, checks.check_bf16_params),
        Check("Skips an fp16 step whose gradients overflow, and lowers the scale", 2, checks.check_overflow),
        Check("Keeps one GradScaler and updates it after every step", 1, checks.check_one_scaler,
              evidence=("fp16_default", "fp16_overflow")),
        Check("Uses the GradScaler passed as scaler=, so its scale carries over to the next epoch", 1,
              checks.check_given_scaler, evidence=("given_scaler",)),
        Check("Clears the gradients every batch", 1, checks.check_zero_grad, evidence=("bf16", "fp16_default")),
        Check("Unscales, then clips the gradient norm to max_norm, then steps", 2, checks.check_clipping,
              evidence=("fp16_clipped",)),
    ],
)
