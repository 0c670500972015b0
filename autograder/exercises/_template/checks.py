"""Checking: plain Python on the observations (no torch here); the reference's observation is the judge."""
from ..judging.checking import case, close, scenario, what
from .cases import ATOL


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
