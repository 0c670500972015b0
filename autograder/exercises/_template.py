"""TEMPLATE exercise module: copy to ``autograder/exercises/<function name>.py`` and rewrite (docs/authoring.md).

The registry skips this file (its name starts with ``_``); tests/test_variants.py grades the template's own
variant suite (tests/variants/_template.py) with it, so the template is known to work.

The example exercise: ``clip_gradients(model, max_norm)`` scales every parameter's ``.grad`` in place so
that their global L2 norm is at most ``max_norm`` (as ``torch.nn.utils.clip_grad_norm_``) and returns the
norm before clipping. Observed on tiny seeded problems: the returned number, the gradients and parameters
after the call.
"""
import torch

from ..exercise import (
    Check,
    Exercise,
    case,
    close,
    observation,
    params_data,
    salted_seed,
    scenario,
    tensor_data,
    what,
)

IN, OUT = 5, 3
ATOL = 1e-6  # float32 round-off between valid styles (one norm over all vs. per-parameter norms combined)

# ---- the scenarios: a table of roles; cases(salt) gives each its inputs ---------------------------------

SCENARIOS = {  # name: (max_norm, what it is: the words after "when")
    "large": (0.1, "the gradients are larger than max_norm"),
    "small": (1000.0, "the gradients are already smaller than max_norm"),
}


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs, JSON-like: public seeds for salt 0, held-out ones for any other salt.

    Keep the roles and the sizes the checks' hints talk about; change only what the salt should hide
    (seeds here; sizes too for an arithmetic exercise, drawn with ``held_out_rng(salt, ...)``).
    """
    return {name: {"what": words, "max_norm": max_norm, "seed": salted_seed(i, salt)}
            for i, (name, (max_norm, words)) in enumerate(SCENARIOS.items())}


# ---- observing: runs next to the student's code, returns plain data only ------------------------------

def run_problem(fn, case: dict) -> dict:
    torch.manual_seed(case["seed"])
    model = torch.nn.Linear(IN, OUT)
    model(torch.randn(8, IN)).pow(2).sum().backward()
    returned = fn(model, case["max_norm"])
    return {
        "returned": float(returned) if isinstance(returned, (int, float, torch.Tensor)) else None,
        "grads": [v for p in model.parameters() for v in tensor_data(p.grad)],
        "params": params_data(model),
    }


def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda case: run_problem(fn, case))


# ---- checking: plain Python on the observations (no torch from here on) -------------------------------

def grads_are_genuine(got: dict, want: dict) -> str | None:
    """The evidence: the gradients after the call point the reference's way, which only the seeded problem
    (and a function that did not wipe them) gives. Checks of flags and counts are believed only with it."""
    if close(got["grads"], want["grads"], atol=ATOL):
        return None
    return f"when {want['case']['what']}, the gradients after your function are not the reference's."


def check_clips(student, reference):
    c = case(reference, "large")
    got, want = scenario(student, "large", c["what"]), reference["scenarios"]["large"]
    if not close(got["grads"], want["grads"], atol=ATOL):
        return (f"With max_norm={c['max_norm']:g} the gradients after your function differ from the clipped ones: "
                "scale every .grad by max_norm / total_norm when the total norm is larger.")
    return None


def check_returns_norm(student, reference):
    got, want = scenario(student, "large", what(reference, "large")), reference["scenarios"]["large"]
    if got["returned"] is None or not close([got["returned"]], [want["returned"]], atol=ATOL, rtol=1e-5):
        return "Return the total norm of the gradients before clipping, as a number."
    return None


def check_params_untouched(student, reference):
    """Passed by a function that does nothing: it names its scenario in ``evidence`` (the evidence rule)."""
    for key in reference["scenarios"]:
        got = scenario(student, key, what(reference, key))
        if not close(got["params"], reference["scenarios"][key]["params"], atol=0.0):
            return "Your function changed the parameters: scale the gradients (p.grad) only."
    return None


EXERCISE = Exercise(
    name="clip_gradients",
    notebook="00_template.ipynb",  # the notebook whose solution cell has grade_id "clip_gradients"
    observe=observe,
    evidence=grads_are_genuine,
    timeout_s=30,
    checks=[
        Check("Clips the gradients to max_norm", 2, check_clips),
        Check("Returns the total norm before clipping", 1, check_returns_norm),
        Check("Leaves the parameters alone", 1, check_params_untouched, evidence=("large", "small")),
    ],
)
