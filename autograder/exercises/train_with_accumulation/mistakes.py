"""The known mistakes of ``train_with_accumulation`` and their fingerprints in the observations (plain Python).

Built from, and tested against, the named wrong variants of tests/variants/train_with_accumulation.py
(tests/exercises/test_diagnosis.py). Each fingerprint reads only what the mistake changes, so two mistakes at once both show.
"""
from ..judging.checking import close
from ..judging.diagnosis import ALL, EVERY, Mistake, ran
from ..judging.localise import Locate
from .cases import ATOL, DEFAULT_K

WINDOWS = ("k2", "k3", "default")  # scenarios with more than one micro-batch per step


def _k(reference, key) -> int:
    return reference["scenarios"][key]["case"]["k"] or DEFAULT_K


def _first_step_times(student, reference, factor) -> str | None:
    """The first step's gradient is factor(k) × the reference's in every windowed scenario that ran."""
    seen = []
    for key in WINDOWS:
        got, want, k = ran(student, key), reference["scenarios"][key], _k(reference, key)
        f = factor(k)
        if not got["step_grads"] or not close(got["step_grads"][0], [f * v for v in want["step_grads"][0]],
                                              atol=ATOL, rtol=1e-4):
            return None
        seen.append((k, f))
    k, f = seen[0]
    return f"with accumulation_steps={k} the first optimizer step's gradient is {f:g} × the reference's"


def loss_not_divided(student, reference):
    return _first_step_times(student, reference, lambda k: k)


def hard_coded_divisor(student, reference):
    return _first_step_times(student, reference, lambda k: k / DEFAULT_K)


def _steps(student, reference, key) -> tuple[int, int, int]:
    c = reference["scenarios"][key]["case"]
    return ran(student, key)["steps"], reference["scenarios"][key]["steps"], c["n_batches"]


def steps_every_batch(student, reference):
    got, want, n = _steps(student, reference, "default")
    if got == n != want and _steps(student, reference, "k2")[0] == reference["scenarios"]["k2"]["case"]["n_batches"]:
        return f"with accumulation_steps={DEFAULT_K} and {n} batches the optimizer stepped {got} times: once per batch"
    return None


def hard_coded_k(student, reference):
    counts = {key: _steps(student, reference, key) for key in ("k1", "k2", "k3")}
    if all(got == n // DEFAULT_K != want for got, want, n in counts.values()):
        return (f"with accumulation_steps=1, 2 and 3 the optimizer stepped once every {DEFAULT_K} batches, as with the "
                "default")
    return None


def _first_step_right(student, reference, key) -> bool:
    got, want = ran(student, key), reference["scenarios"][key]
    return bool(got["step_grads"]) and close(got["step_grads"][0], want["step_grads"][0], atol=ATOL)


def never_zeroes_after_step(student, reference):
    got, want = ran(student, "k2"), reference["scenarios"]["k2"]
    if got["steps"] == want["steps"] and _first_step_right(student, reference, "k2") and not close(
            got["step_grads"][1], want["step_grads"][1], atol=ATOL):
        return ("with accumulation_steps=2 the first step's gradient is right and the second is not: the first "
                "window's gradient is still in it")
    return None


def _windows_wrong_but_k1_right(student, reference) -> bool:
    k1 = ran(student, "k1")
    return close(k1["params"], reference["scenarios"]["k1"]["params"], atol=ATOL) and all(
        ran(student, key)["steps"] == reference["scenarios"][key]["steps"] and not _first_step_right(student, reference, key)
        and not _first_step_times(student, reference, lambda k: k) for key in ("k2", "default"))


def off_by_one_window(student, reference):
    got, want, n = _steps(student, reference, "partial")
    k = _k(reference, "partial")
    if _windows_wrong_but_k1_right(student, reference) and got == -(-n // k) and want == n // k:
        return (f"with {n} batches and accumulation_steps={k} the optimizer stepped {got} times, after batches 1, "
                f"{k + 1}, …, and the first step's gradient is not the first window's")
    return None


def zero_grad_every_batch(student, reference):
    got, want, n = _steps(student, reference, "partial")
    if _windows_wrong_but_k1_right(student, reference) and got == want:
        return ("the optimizer steps at the right batches and accumulation_steps=1 trains exactly as the reference, "
                "but with accumulation_steps=2 or more each step's gradient differs from the window's")
    return None


def steps_each_leftover_batch(student, reference):
    got, want, n = _steps(student, reference, "partial")
    k = _k(reference, "partial")
    if got == n // k + n % k and want == n // k and n % k > 1 and _first_step_right(student, reference, "default"):
        return (f"with {n} batches and accumulation_steps={k} the optimizer stepped {got} times: once after each of "
                f"the last {n % k} batches")
    return None


def _return_ratio(student, reference, key="default") -> float | None:
    got, want = ran(student, key), reference["scenarios"][key]
    if got["returned"] is None or got["returned_has_graph"] or not want["returned"]:
        return None
    return got["returned"] / want["returned"]


def _near(x, target, rel=0.3) -> bool:
    return x is not None and abs(x - target) <= rel * target


def returns_total_not_mean(student, reference):
    n = reference["scenarios"]["default"]["case"]["n_batches"]
    if _near(_return_ratio(student, reference), n):
        return f"the returned loss is about {n} × the mean, with {n} batches"
    return None


def returns_scaled_loss(student, reference):
    k = _k(reference, "default")
    if _near(_return_ratio(student, reference), 1 / k):
        return f"with accumulation_steps={k} the returned loss is about 1/{k} of the mean loss per batch"
    return None


def returns_mean_per_step(student, reference):
    k = _k(reference, "default")
    if _near(_return_ratio(student, reference), k):
        return f"with accumulation_steps={k} the returned loss is about {k} × the mean loss per batch"
    return None


def returns_loss_tensor(student, reference):
    if ran(student, "default")["returned_has_graph"]:
        return "the function returned a tensor still attached to the autograd graph"
    return None


def keeps_loss_tensors(student, reference):
    got = ran(student, "default")
    if not got["returned_has_graph"] and got["max_graphs_alive"] > max(1, reference["scenarios"]["default"]["max_graphs_alive"]):
        return f"up to {got['max_graphs_alive']} earlier batches' autograd graphs were alive during the epoch"
    return None


def forgets_train_mode(student, reference):
    if ran(student, "eval_dropout")["training"] is False:
        return "a model that arrived in eval mode was still in eval mode after your function"
    return None


def no_initial_zero_grad(student, reference):
    stale, want = ran(student, "stale"), reference["scenarios"]["stale"]
    clean = all(close(ran(student, key)["step_grads"][i], g, atol=ATOL)
                for key in ("default", "k2") for i, g in enumerate(reference["scenarios"][key]["step_grads"]))
    if clean and stale["steps"] == want["steps"] and not close(stale["step_grads"][0], want["step_grads"][0], atol=ATOL):
        return ("without leftover gradients every step is right; with gradients left in the model before the call, "
                "the first step is not")
    return None


def _never_steps(student, reference) -> bool:
    return all(ran(student, key)["steps"] == 0 for key in ("default", "k1", "k2", "k3"))


def _returns(student, key):
    return ran(student, key)["returned"]


def own_optimizer(student, reference):
    values = {_returns(student, key) for key in ("default", "k1", "k2", "k3")}
    if _never_steps(student, reference) and len(values) > 1 and None not in values:
        return "the optimizer passed in never stepped, yet the returned losses come from the data"
    return None


def returns_a_constant(student, reference):
    values = {_returns(student, key) for key in ("default", "k1", "k2", "k3")}
    if _never_steps(student, reference) and len(values) == 1:
        return "the optimizer never stepped and the function returned the same value for every data set"
    return None


MISTAKES = [
    Mistake("loss_not_divided", "You call backward() on each micro-batch's whole loss, never divided by "
            "accumulation_steps.", "Gradients of the k micro-batches add up in .grad, so each step applies k times "
            "the window's average gradient (and, with SGD, a k times larger update).",
            "Divide each micro-batch's loss by accumulation_steps before backward().", loss_not_divided,
            variants=("no_division_by_k",)),
    Mistake("hard_coded_divisor", "You divide the loss by a fixed number instead of by accumulation_steps.",
            "With any other accumulation_steps the step applies the wrong multiple of the average gradient.",
            "Divide by the accumulation_steps argument.", hard_coded_divisor),
    Mistake("steps_every_batch", "You call optimizer.step() after every micro-batch.",
            "Accumulation means one step per window of accumulation_steps batches, on their summed gradients.",
            "Step (and zero the gradients) only when (i + 1) % accumulation_steps == 0.", steps_every_batch),
    Mistake("hard_coded_k", "You step every 4 batches whatever accumulation_steps is.",
            "The caller chooses the window size; a fixed number ignores it.",
            "Use the accumulation_steps argument in the step condition.", hard_coded_k, variants=("hard_coded_4",)),
    Mistake("never_zeroes_after_step", "You never zero the gradients after an optimizer step.",
            "backward() adds into .grad, so every window's gradient also carries all the earlier windows'.",
            "Call optimizer.zero_grad() right after each optimizer.step().", never_zeroes_after_step),
    Mistake("off_by_one_window", "Your step condition is i % accumulation_steps == 0 (0-based i).",
            "That steps after the first batch, then after batches k+1, 2k+1, …: every window is shifted by one.",
            "Step when (i + 1) % accumulation_steps == 0.", off_by_one_window),
    Mistake("zero_grad_every_batch", "You zero the gradients before every micro-batch.",
            "That throws away the window's earlier micro-batches: each step applies only the last one's gradient.",
            "Zero the gradients once at the start and after each optimizer step, never inside the window.",
            zero_grad_every_batch),
    Mistake("steps_each_leftover_batch", "Meaning to flush the last, short window, you step after each of its batches.",
            "The leftover batches are one window: they should give one step (or none), not one step each.",
            "Flush the leftover batches with a single optimizer step after the loop (or drop them).",
            steps_each_leftover_batch, explains=("partial window",)),
    Mistake("returns_total_not_mean", "You return the sum of the batch losses.",
            "The contract is the mean loss per batch, comparable across epochs of different lengths.",
            "Divide the summed loss by len(dataloader).", returns_total_not_mean, explains=("Python float",)),
    Mistake("returns_scaled_loss", "You return the mean of the losses divided by accumulation_steps.",
            "Dividing by accumulation_steps is for the gradients; the loss you report should be the batch's own.",
            "Accumulate loss.item() before dividing (or multiply the scaled loss back) for the returned mean.",
            returns_scaled_loss, explains=("Python float",)),
    Mistake("returns_mean_per_step", "You divide the summed loss by the number of optimizer steps.",
            "The contract is the mean per batch: there are accumulation_steps batches per step.",
            "Divide the summed loss by len(dataloader).", returns_mean_per_step, explains=("Python float",)),
    Mistake("returns_loss_tensor", "You sum the loss tensors themselves and return a tensor.",
            "Each loss tensor keeps its batch's whole autograd graph alive, and the caller expects a float.",
            "Accumulate loss.item() (a Python float).", returns_loss_tensor, explains=("Python float", "graph"),
            variants=("sums_loss_tensors",)),
    Mistake("keeps_loss_tensors", "You keep every batch's loss tensor (in a list) until the end.",
            "Each kept tensor holds its batch's autograd graph, so memory grows with the epoch.",
            "Keep loss.item() (a Python float) instead of the tensor.", keeps_loss_tensors, explains=("graph",),
            variants=("keeps_loss_tensors_in_a_list",)),
    Mistake("forgets_train_mode", "You never call model.train().",
            "A model that arrives in eval mode then trains with dropout (and batch norm) switched off.",
            "Call model.train() at the start.", forgets_train_mode, explains=("training mode",)),
    Mistake("no_initial_zero_grad", "You do not zero the gradients before the first batch.",
            "Gradients left in the model from earlier work (an evaluation's backward, a previous epoch) leak into "
            "the first step.", "Call optimizer.zero_grad() once before the loop.", no_initial_zero_grad,
            explains=("left from before",)),
    Mistake("own_optimizer", "You create your own optimizer instead of using the one passed in.",
            "The caller's optimizer (its learning rate, momentum, state) never steps, so training ignores it.",
            "Use the optimizer argument.", own_optimizer, explains=ALL),
    Mistake("returns_a_constant", "Your function does not train: it returns the same value whatever the data.",
            "Nothing in it runs the model, the loss or the optimizer.",
            "Write the training loop the docstring describes.", returns_a_constant,
            variants=("returns_the_printed_constant", "returns_zero"), includes=EVERY),
]


# What the observed values are called in the exercise, and the factors a plausible mistake scales them by.
LOCATE = Locate(names={"returned": "the returned loss", "steps": "the number of optimizer steps",
                       "step_grads": "the gradient at each optimizer step", "params": "the parameters after training",
                       "training": "the model's training mode", "max_graphs_alive": "the number of graphs kept alive",
                       "returned_type": "the returned type", "returned_is_float": "returning a float",
                       "returned_has_graph": "the returned loss holding a graph"},
                factors=lambda case: {"accumulation_steps": case["k"] or DEFAULT_K,
                                      "the number of batches": case["n_batches"]})
