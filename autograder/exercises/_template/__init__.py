"""TEMPLATE exercise package: copy the folder to ``autograder/exercises/<function name>/`` and rewrite it
(docs/authoring.md). The registry skips it (its name starts with ``_``); tests/exercises/test_variants.py grades the
template's own variant suite (tests/variants/_template.py) with it, so the template is known to work.

The example exercise: ``clip_gradients(model, max_norm)`` scales every parameter's ``.grad`` in place so that
their global L2 norm is at most ``max_norm`` (as ``torch.nn.utils.clip_grad_norm_``) and returns the norm before
clipping. Observed on tiny seeded problems: the returned number, the gradients and parameters after the call.

Four files, one job each: ``cases.py`` (the scenarios), ``observe.py`` (runs next to the student's code; the only
file that imports torch), ``checks.py`` (the verdict, plain Python), and this one, which puts them together.
"""
from ..exercise import Check, Exercise
from . import cases, checks

EXERCISE = Exercise(
    name="clip_gradients",
    notebook="00_template.ipynb",  # the notebook whose solution cell has grade_id "clip_gradients"
    cases=cases.cases,
    observer=f"{__name__}.observe",
    evidence=checks.grads_are_genuine,
    timeout_s=30,
    checks=[
        Check("Clips the gradients to max_norm", 2, checks.check_clips),
        Check("Returns the total norm before clipping", 1, checks.check_returns_norm),
        Check("Leaves the parameters alone", 1, checks.check_params_untouched, evidence=("large", "small")),
    ],
)
