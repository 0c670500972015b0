"""The checks of ``train_with_accumulation``: plain Python on the observations (no torch here)."""
from ..judging.checking import case, close, off_by, parallel, scenario, what
from .cases import ATOL, DEFAULT_K


def first_step_is_genuine(got: dict, want: dict) -> str | None:
    """The evidence: the first optimizer step's gradient points the reference's way. Only training on the
    scenario's seeded data gives it, so a count or a flag of the same scenario is then believed."""
    if got["step_grads"] and parallel(got["step_grads"][0], want["step_grads"][0]):
        return None
    k = want["case"]["k"] or DEFAULT_K
    return (f"with accumulation_steps={k} your first optimizer step does not use the gradient of the first {k} "
            "batches: call backward() on every micro-batch and step after the k-th.")


def check_return(student, reference):
    got, want = scenario(student, "default", what(reference, "default")), reference["scenarios"]["default"]
    if got["returned_has_graph"]:
        return ("You return a tensor that is still attached to the autograd graph: accumulate `loss.item()` "
                "(a Python float), not the loss tensor.")
    if not got["returned_is_float"]:
        return f"Return a Python float (the mean loss per batch); your function returned a {got['returned_type']}."
    if not close([got["returned"]], [want["returned"]], atol=1e-6, rtol=1e-5):
        return (f"The returned mean loss, {got['returned']:.2g}, is {off_by(got['returned'], want['returned'])}: "
                "add `loss.item() * accumulation_steps` (the unscaled loss) each batch and divide by "
                "len(dataloader).")
    return None


def check_step_timing(student, reference):
    for key in ("default", "k1", "k2", "k3"):
        c = case(reference, key)
        k = c["k"] or DEFAULT_K
        got, want = scenario(student, key, c["what"]), reference["scenarios"][key]
        if got["steps"] != want["steps"]:
            hint = " Use the accumulation_steps argument, not a fixed number." if c["k"] else ""
            return (f"With accumulation_steps={k} and {c['n_batches']} batches the optimizer should step "
                    f"{want['steps']} times; yours stepped {got['steps']} times.{hint}")
    return None


def check_window_gradient(student, reference):
    for key in ("k2", "default"):
        k = case(reference, key)["k"] or DEFAULT_K
        got, want = scenario(student, key, what(reference, key)), reference["scenarios"][key]
        if got["steps"] != want["steps"]:
            return "The optimizer does not step once per window, so the applied gradients cannot be compared."
        for i, (g, w) in enumerate(zip(got["step_grads"], want["step_grads"])):
            if close(g, [k * v for v in w], atol=ATOL):
                return (f"At optimizer step {i + 1} the gradient is {k} times the expected one: divide each "
                        "micro-batch's loss by accumulation_steps before backward().")
            if not close(g, w, atol=ATOL):
                return (f"At optimizer step {i + 1} the gradient differs from the average over the window: "
                        "zero the gradients after each step (and once at the start), and call backward() on "
                        "every micro-batch.")
    return None


def check_final_params(student, reference):
    for key in ("k1", "k2", "default", "momentum"):
        c = case(reference, key)
        got = scenario(student, key, c["what"])
        if not close(got["params"], reference["scenarios"][key]["params"], atol=ATOL):
            setting = "SGD with momentum" if c["momentum"] else f"accumulation_steps={c['k'] or DEFAULT_K}"
            return f"After one epoch with {setting} the model's parameters differ from the reference solution's."
    return None


def check_partial_window(student, reference):
    c = case(reference, "partial")
    n, k = c["n_batches"], c["k"] or DEFAULT_K
    got = scenario(student, "partial", c["what"])
    if any(close(got["params"], ok, atol=ATOL) for ok in reference["partial_accepted"]):
        return None
    return (f"With {n} batches and accumulation_steps={k} the parameters match neither choice for the last "
            f"{n % k} batches: drop them (no step) or flush them with one final optimizer step.")


def check_train_mode(student, reference):
    got = scenario(student, "eval_dropout", what(reference, "eval_dropout"))
    if not got["training"]:
        return "Your function leaves a model that arrived in eval mode in eval mode: call model.train() first."
    if not close(got["params"], reference["scenarios"]["eval_dropout"]["params"], atol=ATOL):
        return "With a dropout model that arrived in eval mode the parameters differ: call model.train() first."
    return None


def check_stale_gradients(student, reference):
    got = scenario(student, "stale", what(reference, "stale"))
    if not close(got["params"], reference["scenarios"]["stale"]["params"], atol=ATOL):
        return ("Gradients left in the model from before the call leak into your first step: "
                "call optimizer.zero_grad() before the first batch.")
    return None


def check_no_graphs_kept(student, reference):
    got, want = scenario(student, "default", what(reference, "default")), reference["scenarios"]["default"]
    if got["returned_has_graph"] or got["max_graphs_alive"] > max(1, want["max_graphs_alive"]):
        return (f"Up to {got['max_graphs_alive']} earlier batches' autograd graphs were still alive during the "
                "epoch: keep only `loss.item()` (a float) across batches, never the loss tensor.")
    return None
