"""Lesson 1 exercise: ``train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4)``.

Observed on tiny seeded problems (a 2-layer MLP on random data, 4 samples a batch):
what the function returns, how often the optimizer steps, the gradient each step
applies, the final parameters, and how many batches' autograd graphs stay alive.
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="train_with_accumulation",
    notebook="01_gradient_accumulation.ipynb",
    cases=cases.cases,
    observer=f"{__name__}.observe",
    evidence=checks.first_step_is_genuine,
    checks=[
        Check("Returns the mean unscaled loss per batch as a Python float", 1, checks.check_return, evidence=("default",)),
        Check("Steps once every accumulation_steps batches (k = 1, 2, 3, 4)", 2, checks.check_step_timing,
              evidence=("default", "k1", "k2", "k3")),
        Check("Each step applies the window's average gradient", 2, checks.check_window_gradient),
        Check("Final parameters match the reference (k = 1, 2, 4; SGD with momentum)", 2, checks.check_final_params),
        Check("Handles a final partial window (dropped or flushed)", 1, checks.check_partial_window),
        Check("Puts the model in training mode", 1, checks.check_train_mode),
        Check("Clears gradients left from before the call", 1, checks.check_stale_gradients),
        Check("Keeps no autograd graph alive across batches", 1, checks.check_no_graphs_kept, evidence=("default",)),
    ],
)
