"""Lesson 3 exercise: ``average_gradients(model)``, the heart of data parallelism.

Called on every rank of an initialised process group after ``loss.backward()``, it must leave
in every parameter's ``.grad`` the average of that gradient over all ranks. The grader really
runs it: 2 and 3 forked local processes (gloo over loopback, ``coursekit.dist.launch``), each
training a small seeded model on its own shard of the data with a manual data-parallel loop::

    loss.backward(); average_gradients(model); optimizer.step()

Around every call each rank records its gradients and parameters (before and after), and its
final parameters. The reference observation adds the same training done by torch's
``DistributedDataParallel`` and by one process on the full batch, which the checks compare with.

Correct behaviour for a parameter whose ``.grad`` is None (a frozen weight, or a layer this
forward pass did not use): leave it None, without crashing. Every rank runs the same model, so
every rank skips the same parameters and the collectives still pair up. This is what DDP does
(frozen weights are not registered; with ``find_unused_parameters=True`` globally unused ones
keep ``grad=None``); a zero gradient instead would let momentum or weight decay move weights
that received no gradient (tests/test_average_gradients.py checks both claims).
"""
import warnings

import torch
import torch._dynamo  # noqa: F401  torch.optim and DDP import it lazily (3–6 s): here, once, not in every forked rank
from torch import nn

from coursekit.dist import launch

from ..exercise import (
    Check,
    Exercise,
    ScenarioError,
    case,
    close,
    observation,
    params_data,
    run_on_ranks,
    salted_seed,
    scenario,
    student_call,
    tensor_data,
    what,
)

IN, HIDDEN, OUT = 6, 5, 3
BATCH, STEPS = 4, 3                 # per-rank micro-batch, optimizer steps
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 0.01
MODEL_SEED, DATA_SEED = 1234, 99    # the public scenarios' seeds (salt 0)
LAUNCH_TIMEOUT_S = 8.0              # a correct run takes well under a second
GRAD_ATOL, PARAM_ATOL = 1e-6, 1e-5  # float32 round-off between valid styles (sum order, *1/N vs /N)

SCENARIOS = {  # name: (world size, model with an unused layer and a frozen bias?, what it is)
    "two_ranks": (2, False, "called on 2 ranks"),
    "three_ranks": (3, False, "called on 3 ranks"),
    "no_grad_params": (2, True, "the model has an unused layer and a frozen bias (their .grad is None)"),
}


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs; the seeds are public for salt 0 and held out for any other salt."""
    return {name: {"what": what, "world_size": world_size, "with_unused": with_unused, "steps": STEPS,
                   "model_seed": salted_seed(MODEL_SEED, salt), "data_seed": salted_seed(DATA_SEED, salt)}
            for name, (world_size, with_unused, what) in SCENARIOS.items()}


# ---- the problem every rank trains ----------------------------------------------------------

class Net(nn.Module):
    """A tiny MLP; optionally with a frozen bias and a layer the forward pass never uses."""

    def __init__(self, with_unused: bool):
        super().__init__()
        self.hidden = nn.Linear(IN, HIDDEN)
        self.out = nn.Linear(HIDDEN, OUT)
        if with_unused:
            self.hidden.bias.requires_grad_(False)   # frozen: its .grad stays None
            self.unused = nn.Linear(HIDDEN, OUT)    # never called: its .grad stays None too

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x)))


def make_problem(world_size: int, with_unused: bool, *, steps: int = STEPS, model_seed: int = MODEL_SEED,
                 data_seed: int = DATA_SEED):
    """Identical on every rank: the same seeds give the same initial weights and the same data."""
    torch.manual_seed(model_seed)
    model = Net(with_unused)
    generator = torch.Generator().manual_seed(data_seed)
    n = steps * BATCH * world_size
    x = torch.randn(n, IN, generator=generator)
    y = torch.randint(0, OUT, (n,), generator=generator)
    return model, x, y


def problem_of(case: dict):
    return make_problem(case["world_size"], case["with_unused"], steps=case["steps"], model_seed=case["model_seed"],
                        data_seed=case["data_seed"])


def make_optimizer(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)


def local_batch(x, y, rank: int, world_size: int, step: int):
    """DistributedSampler's split without shuffling: rank r owns samples r, r+N, r+2N, ..."""
    xs, ys = x[rank::world_size], y[rank::world_size]
    return xs[step * BATCH:(step + 1) * BATCH], ys[step * BATCH:(step + 1) * BATCH]


def _grads(model) -> list:
    return [tensor_data(p.grad) if p.grad is not None else None for p in model.parameters()]


def manual_data_parallel(rank: int, world_size: int, fn, case: dict) -> dict:
    """One rank of the manual loop, recording gradients and parameters around every call of ``fn``."""
    warnings.simplefilter("ignore")  # a rank's warnings would reach the notebook's stderr
    model, x, y = problem_of(case)
    optimizer = make_optimizer(model.parameters())
    calls = []
    for step in range(case["steps"]):
        xb, yb = local_batch(x, y, rank, world_size, step)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(xb), yb).backward()
        call = {"grads_before": _grads(model), "params_before": params_data(model)}
        student_call(fn, model)
        call.update(grads_after=_grads(model), params_after=params_data(model))
        calls.append(call)
        optimizer.step()
    return {"calls": calls, "final": params_data(model)}


def ddp_rank(rank: int, world_size: int, case: dict) -> list[float]:
    """The same training with torch's DistributedDataParallel: the ground truth."""
    warnings.simplefilter("ignore")
    model, x, y = problem_of(case)
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=case["with_unused"])
    optimizer = make_optimizer(ddp.parameters())
    for step in range(case["steps"]):
        xb, yb = local_batch(x, y, rank, world_size, step)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(xb), yb).backward()
        optimizer.step()
    return params_data(model)


def single_process(case: dict) -> list[float]:
    """One process, one batch of world_size × BATCH samples per step (the same samples the ranks share)."""
    model, x, y = problem_of(case)
    optimizer = make_optimizer(model.parameters())
    rows_per_step = BATCH * case["world_size"]
    for step in range(case["steps"]):
        rows = slice(step * rows_per_step, (step + 1) * rows_per_step)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
        optimizer.step()
    return params_data(model)


# ---- observing: real processes ---------------------------------------------------------------

def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda case: run_on_ranks(
        manual_data_parallel, case["world_size"], fn, case, timeout=LAUNCH_TIMEOUT_S))


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    result["ddp"], result["single"] = {}, {}
    for name, scenario_ in result["scenarios"].items():
        c = scenario_["case"]
        result["ddp"][name] = launch(ddp_rank, c["world_size"], c, backend="gloo", timeout=60)
        result["single"][name] = single_process(c)
    return result


# ---- reading an observation (plain Python only: no torch from here on) -----------------------

def ranks_of(student: dict, reference: dict, key: str) -> list[dict]:
    """The scenario's per-rank records, or a ScenarioError with one sentence for the student."""
    try:
        return scenario(student, key, what(reference, key))["ranks"]
    except ScenarioError as exc:
        if "NoneType" in str(exc):
            raise ScenarioError(f"{exc} Parameters whose .grad is None must be skipped.") from None
        raise


def flat(grads) -> list:
    """Per-parameter gradient lists joined into one, None (no gradient) counted as missing."""
    return [v for g in grads if g is not None for v in g] if isinstance(grads, list) else []


def mean_over_ranks(vectors: list[list[float]]) -> list[float]:
    return [sum(vals) / len(vals) for vals in zip(*vectors)]


def scale_factor(got: list[float], want: list[float]) -> float | None:
    """c minimising |got − c·want| (how many times the average the student's gradient is)."""
    denominator = sum(w * w for w in want)
    return sum(g * w for g, w in zip(got, want)) / denominator if denominator else None


def averaging_problem(ranks: list[dict], n: int, label: str) -> str | None:
    """Whether every call left every rank with the mean over ranks of the gradients it was given."""
    for c in range(len(ranks[0]["calls"])):
        before = [flat(r["calls"][c]["grads_before"]) for r in ranks]
        after = [flat(r["calls"][c]["grads_after"]) for r in ranks]
        want = mean_over_ranks(before)
        if n > 1 and not close(before[0], want, atol=GRAD_ATOL, rtol=1e-5) and all(
                close(got, before[0], atol=GRAD_ATOL, rtol=1e-5) for got in after):
            return (f"{label}, call {c + 1}: every rank holds rank 0's gradient, not the average over ranks: "
                    "use all_reduce, not broadcast.")
        for rank, got in enumerate(after):
            if close(got, want, atol=GRAD_ATOL, rtol=1e-5):
                continue
            where = f"{label}, call {c + 1}, rank {rank}"
            if len(got) != len(want):
                return f"{where}: some parameters lost their gradient: keep every .grad, averaged in place."
            if close(got, before[rank], atol=GRAD_ATOL, rtol=1e-5):
                return (f"{where}: the gradient is still this rank's own: all-reduce each parameter's .grad "
                        "(not the parameter) and divide by the world size.")
            if rank > 0 and close(after[0], want, atol=GRAD_ATOL, rtol=1e-5):
                return (f"{where}: only rank 0 holds the average, as after dist.reduce: use dist.all_reduce, which "
                        "leaves the result on every rank.")
            factor = scale_factor(got, want)
            if factor is not None and close(got, [factor * w for w in want], atol=GRAD_ATOL, rtol=1e-4):
                if abs(factor - n) < 1e-3:
                    return (f"{where}: the gradient is {n}× the average: all_reduce sums, so divide by the world "
                            "size afterwards.")
                return (f"{where}: the gradient is {factor:.3g}× the average: divide the summed gradient by the "
                        f"world size ({n}) exactly once.")
            return f"{where}: the gradient is not the average of the ranks' gradients."
    return None


def ranks_really_averaged(got: dict, want: dict) -> str | None:
    """The evidence, in two parts. Each rank's first local gradient, computed by the grader's loop before the
    student's function ran, equals the reference's: only the real run on the seeded problem gives it. And after
    the first call some rank holds a gradient that is not a multiple of its own: gradients were combined across
    ranks. A function that does nothing (or only scales) passes no check, however vacuously true."""
    mine, theirs = got["ranks"], want["ranks"]
    if len(mine) != len(theirs) or not all(
            close(flat(g["calls"][0]["grads_before"]), flat(w["calls"][0]["grads_before"]), atol=GRAD_ATOL)
            for g, w in zip(mine, theirs)):
        return "the ranks' own gradients differ from the grader's seeded problem."
    for r in mine:
        before, after = flat(r["calls"][0]["grads_before"]), flat(r["calls"][0]["grads_after"])
        if len(after) != len(before):
            return None  # it changed which parameters have a gradient: not nothing (other checks judge it)
        factor = scale_factor(after, before)
        if factor is not None and not close(after, [factor * b for b in before], atol=GRAD_ATOL, rtol=1e-5):
            return None
    return (f"when {want['case']['what']}, every rank still holds its own gradient (or a multiple of it) after your "
            "function: it combined nothing across ranks.")


# ---- the checks ----------------------------------------------------------------------------

def check_same_on_every_rank(student, reference):
    ranks = ranks_of(student, reference, "two_ranks")
    for c, call0 in enumerate(ranks[0]["calls"]):
        for rank, r in enumerate(ranks[1:], start=1):
            if not close(flat(r["calls"][c]["grads_after"]), flat(call0["grads_after"]), atol=GRAD_ATOL, rtol=1e-5):
                unchanged = all(close(flat(x["calls"][c]["grads_after"]), flat(x["calls"][c]["grads_before"]),
                                      atol=GRAD_ATOL) for x in ranks)
                if unchanged:
                    return (f"After call {c + 1} each rank still holds its own gradient: all-reduce every "
                            "parameter's .grad, not the parameters.")
                return (f"After call {c + 1} rank 0 and rank {rank} hold different gradients: use dist.all_reduce, "
                        "which leaves the result on every rank (dist.reduce fills only the destination rank).")
    return None


def check_average_two(student, reference):
    n = case(reference, "two_ranks")["world_size"]
    return averaging_problem(ranks_of(student, reference, "two_ranks"), n, f"With {n} ranks")


def check_world_size(student, reference):
    n = case(reference, "three_ranks")["world_size"]
    ranks = ranks_of(student, reference, "three_ranks")
    problem = averaging_problem(ranks, n, f"With {n} ranks")
    if problem and f"{n / 2:.3g}× the average" in problem:
        return (f"With {n} ranks your gradient is {n / 2:.3g}× the average, as if you divided by 2: ask "
                "dist.get_world_size() instead of hard-coding the number of ranks.")
    if problem:
        return problem
    want = reference["ddp"]["three_ranks"][0]
    if not all(close(r["final"], want, atol=PARAM_ATOL) for r in ranks):
        return f"With {n} ranks the trained parameters differ from DistributedDataParallel's."
    return None


def check_params_untouched(student, reference):
    for rank, r in enumerate(ranks_of(student, reference, "two_ranks")):
        for c, call in enumerate(r["calls"]):
            if not close(call["params_after"], call["params_before"], atol=1e-7):
                return (f"Call {c + 1} changed rank {rank}'s parameters: average the gradients (p.grad) and leave "
                        "the parameters to the optimizer's step.")
    return None


def check_no_grad_params(student, reference):
    ranks = ranks_of(student, reference, "no_grad_params")
    for c in range(case(reference, "no_grad_params")["steps"]):
        calls = [r["calls"][c] for r in ranks]
        averaged = []  # per parameter with a gradient: did the call change it on some rank?
        for i, before in enumerate(calls[0]["grads_before"]):
            if before is None:
                if any(call["grads_after"][i] is not None for call in calls):
                    return ("You gave a gradient to parameters that had none (a frozen bias, an unused layer): leave "
                            ".grad as None, as DDP does; with momentum or weight decay a zero gradient moves them.")
                averaged.append(None)
            else:
                averaged.append(any(call["grads_after"][i] is None or not close(
                    call["grads_after"][i], call["grads_before"][i], atol=0.0) for call in calls))
        first_none = averaged.index(None)
        if any(averaged[:first_none]) and not all(a for a in averaged[first_none:] if a is not None):
            return ("Parameters that come after one without a gradient were not averaged: skip only the "
                    "parameters whose .grad is None (continue, not break or return).")
    return None


def check_matches_ddp(student, reference):
    c = case(reference, "two_ranks")
    finals = [r["final"] for r in ranks_of(student, reference, "two_ranks")]
    ddp, single = reference["ddp"]["two_ranks"][0], reference["single"]["two_ranks"]
    if all(close(f, ddp, atol=PARAM_ATOL) and close(f, single, atol=PARAM_ATOL) for f in finals):
        return None
    if not close(finals[0], finals[1], atol=PARAM_ATOL):
        return (f"After {c['steps']} steps of data-parallel training the {c['world_size']} ranks hold different "
                "parameters: every rank must step with the same (averaged) gradient.")
    return (f"After {c['steps']} steps on {c['world_size']} ranks the parameters match neither "
            "DistributedDataParallel nor one process on the full batch.")


EXERCISE = Exercise(
    name="average_gradients",
    notebook="03_data_parallel.ipynb",
    observe=observe,
    observe_reference=observe_reference,
    evidence=ranks_really_averaged,
    timeout_s=60,  # three launches; a deadlocking submission spends LAUNCH_TIMEOUT_S in each
    checks=[
        Check("Every rank holds the same gradients after the call (all-reduce, not reduce)", 2,
              check_same_on_every_rank, evidence=("two_ranks",)),
        Check("The gradient is the average: the sum over ranks divided by the world size (2 ranks)", 2,
              check_average_two, evidence=("two_ranks",)),
        Check("Uses the real world size (3 ranks)", 2, check_world_size),
        Check("Changes the gradients only, never the parameters", 1, check_params_untouched,
              evidence=("two_ranks",)),
        Check("Leaves parameters without a gradient alone (frozen bias, unused layer)", 2, check_no_grad_params,
              evidence=("no_grad_params",)),
        Check("Training with it matches DDP and one process on the full batch (2 ranks)", 2, check_matches_ddp),
    ],
)
