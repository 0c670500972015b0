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

from coursekit.dist import RankFailed, RanksTimedOut, launch

from ..exercise import NOT_DONE, Check, Exercise, ScenarioError, close, describe_exception, tensor_data

IN, HIDDEN, OUT = 6, 5, 3
BATCH, STEPS = 4, 3                 # per-rank micro-batch, optimizer steps
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 0.01
LAUNCH_TIMEOUT_S = 8.0              # a correct run takes well under a second
GRAD_ATOL, PARAM_ATOL = 1e-6, 1e-5  # float32 round-off between valid styles (sum order, *1/N vs /N)
FAILED_MARK = "average_gradients raised: "

SCENARIOS = {  # name: (world size, model with an unused layer and a frozen bias?)
    "two_ranks": (2, False),
    "three_ranks": (3, False),
    "no_grad_params": (2, True),
}


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


def make_problem(world_size: int, with_unused: bool):
    """Identical on every rank: the same seed gives the same initial weights and the same data."""
    torch.manual_seed(1234)
    model = Net(with_unused)
    generator = torch.Generator().manual_seed(99)
    n = STEPS * BATCH * world_size
    x = torch.randn(n, IN, generator=generator)
    y = torch.randint(0, OUT, (n,), generator=generator)
    return model, x, y


def make_optimizer(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)


def local_batch(x, y, rank: int, world_size: int, step: int):
    """DistributedSampler's split without shuffling: rank r owns samples r, r+N, r+2N, ..."""
    xs, ys = x[rank::world_size], y[rank::world_size]
    return xs[step * BATCH:(step + 1) * BATCH], ys[step * BATCH:(step + 1) * BATCH]


def _grads(model) -> list:
    return [tensor_data(p.grad) if p.grad is not None else None for p in model.parameters()]


def _params(model) -> list[float]:
    return [v for p in model.parameters() for v in tensor_data(p)]


class StudentCodeFailed(RuntimeError):
    """The function under test raised inside a rank; the message is what it raised."""


def manual_data_parallel(rank: int, world_size: int, fn, with_unused: bool) -> dict:
    """One rank of the manual loop, recording gradients and parameters around every call of ``fn``."""
    warnings.simplefilter("ignore")  # a rank's warnings would reach the notebook's stderr
    model, x, y = make_problem(world_size, with_unused)
    optimizer = make_optimizer(model.parameters())
    calls = []
    for step in range(STEPS):
        xb, yb = local_batch(x, y, rank, world_size, step)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(xb), yb).backward()
        call = {"grads_before": _grads(model), "params_before": _params(model)}
        try:
            fn(model)
        except Exception as exc:  # keep only the student's words; the rank's traceback is noise here
            raise StudentCodeFailed(FAILED_MARK + describe_exception(exc).replace("\n", " ")) from None
        call.update(grads_after=_grads(model), params_after=_params(model))
        calls.append(call)
        optimizer.step()
    return {"calls": calls, "final": _params(model)}


def ddp_rank(rank: int, world_size: int, with_unused: bool) -> list[float]:
    """The same training with torch's DistributedDataParallel: the ground truth."""
    warnings.simplefilter("ignore")
    model, x, y = make_problem(world_size, with_unused)
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=with_unused)
    optimizer = make_optimizer(ddp.parameters())
    for step in range(STEPS):
        xb, yb = local_batch(x, y, rank, world_size, step)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(xb), yb).backward()
        optimizer.step()
    return _params(model)


def single_process(world_size: int, with_unused: bool) -> list[float]:
    """One process, one batch of world_size × BATCH samples per step (the same samples the ranks share)."""
    model, x, y = make_problem(world_size, with_unused)
    optimizer = make_optimizer(model.parameters())
    for step in range(STEPS):
        rows = slice(step * BATCH * world_size, (step + 1) * BATCH * world_size)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
        optimizer.step()
    return _params(model)


# ---- running a scenario in real processes --------------------------------------------------

def _stuck_sentence(world_size: int) -> str:
    return (f"With {world_size} ranks, a rank waited in a collective that another rank never called (the grader "
            f"stopped them after {LAUNCH_TIMEOUT_S:g} s): every rank must call the same collectives, in the same "
            "order, on tensors of the same shape.")


def run_ranks(fn, world_size: int, with_unused: bool) -> dict:
    """The per-rank records of the manual loop, or ``{"error": ...}`` (a deadlock gets its own sentence)."""
    try:
        ranks = launch(manual_data_parallel, world_size, fn, with_unused, backend="gloo", timeout=LAUNCH_TIMEOUT_S)
    except RanksTimedOut:
        return {"error": "deadlock", "stuck": _stuck_sentence(world_size)}
    except RankFailed as exc:
        text = str(exc)
        if FAILED_MARK not in text:
            return {"error": text.strip().splitlines()[-1][:300]}
        raised = " ".join(text.split(FAILED_MARK, 1)[1].splitlines()[0].split())[:200]
        if any(s in raised for s in ("Timed out", "timed out", "closed by peer", "Connection reset", "Broken pipe")):
            return {"error": "deadlock", "stuck": _stuck_sentence(world_size)}
        return {"error": raised}
    return {"world_size": world_size, "ranks": ranks}


def observe(fn) -> dict:
    scenarios = {}
    for name, (world_size, with_unused) in SCENARIOS.items():
        try:
            scenarios[name] = run_ranks(fn, world_size, with_unused)
        except Exception as exc:  # the launch itself failed (no ports, no processes left...)
            scenarios[name] = {"error": describe_exception(exc)}
    return {"scenarios": scenarios}


def observe_reference(fn) -> dict:
    observation = observe(fn)
    observation["ddp"], observation["single"] = {}, {}
    for name, (world_size, with_unused) in SCENARIOS.items():
        observation["ddp"][name] = launch(ddp_rank, world_size, with_unused, backend="gloo", timeout=60)
        observation["single"][name] = single_process(world_size, with_unused)
    return observation


# ---- reading an observation (plain Python only: no torch from here on) -----------------------

def run_of(observation: dict, key: str, what: str) -> dict:
    """The scenario's per-rank records, or a ScenarioError with one sentence for the student."""
    data = observation.get("scenarios", {}).get(key)
    if data is None:
        raise ScenarioError(f"No result for {what}: the grader's observation is incomplete.")
    if "error" in data:
        if data["error"] == "deadlock":
            raise ScenarioError(data["stuck"])
        if data["error"].startswith("NotImplementedError"):
            raise ScenarioError(NOT_DONE)
        hint = (" Parameters whose .grad is None must be skipped." if "NoneType" in data["error"] else "")
        raise ScenarioError(f"Your function raised {data['error'].rstrip('.')} when {what}.{hint}")
    return data


def flat(grads: list) -> list:
    """Per-parameter gradient lists joined into one, None (no gradient) counted as missing."""
    return [v for g in grads if g is not None for v in g]


def mean_over_ranks(vectors: list[list[float]]) -> list[float]:
    return [sum(vals) / len(vals) for vals in zip(*vectors)]


def scale_factor(got: list[float], want: list[float]) -> float | None:
    """c minimising |got − c·want| (how many times the average the student's gradient is)."""
    denominator = sum(w * w for w in want)
    return sum(g * w for g, w in zip(got, want)) / denominator if denominator else None


def averaging_problem(run: dict, label: str) -> str | None:
    """Whether every call left every rank with the mean over ranks of the gradients it was given."""
    ranks, n = run["ranks"], run["world_size"]
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


# ---- the checks ----------------------------------------------------------------------------

def check_same_on_every_rank(student, reference):
    run = run_of(student, "two_ranks", "called on 2 ranks")
    for c, call0 in enumerate(run["ranks"][0]["calls"]):
        for rank, r in enumerate(run["ranks"][1:], start=1):
            if not close(flat(r["calls"][c]["grads_after"]), flat(call0["grads_after"]), atol=GRAD_ATOL, rtol=1e-5):
                unchanged = all(close(flat(x["calls"][c]["grads_after"]), flat(x["calls"][c]["grads_before"]),
                                      atol=GRAD_ATOL) for x in run["ranks"])
                if unchanged:
                    return (f"After call {c + 1} each rank still holds its own gradient: all-reduce every "
                            "parameter's .grad, not the parameters.")
                return (f"After call {c + 1} rank 0 and rank {rank} hold different gradients: use dist.all_reduce, "
                        "which leaves the result on every rank (dist.reduce fills only the destination rank).")
    return None


def check_average_two(student, reference):
    return averaging_problem(run_of(student, "two_ranks", "called on 2 ranks"), "With 2 ranks")


def check_world_size(student, reference):
    run = run_of(student, "three_ranks", "called on 3 ranks")
    problem = averaging_problem(run, "With 3 ranks")
    if problem and "1.5× the average" in problem:
        return ("With 3 ranks your gradient is 1.5× the average, as if you divided by 2: ask "
                "dist.get_world_size() instead of hard-coding the number of ranks.")
    if problem:
        return problem
    want = reference["ddp"]["three_ranks"][0]
    if not all(close(r["final"], want, atol=PARAM_ATOL) for r in run["ranks"]):
        return "With 3 ranks the trained parameters differ from DistributedDataParallel's."
    return None


def check_params_untouched(student, reference):
    run = run_of(student, "two_ranks", "called on 2 ranks")
    for rank, r in enumerate(run["ranks"]):
        for c, call in enumerate(r["calls"]):
            if not close(call["params_after"], call["params_before"], atol=1e-7):
                return (f"Call {c + 1} changed rank {rank}'s parameters: average the gradients (p.grad) and leave "
                        "the parameters to the optimizer's step.")
    return None


def check_no_grad_params(student, reference):
    run = run_of(student, "no_grad_params", "the model has an unused layer and a frozen bias (their .grad is None)")
    for c in range(STEPS):
        calls = [r["calls"][c] for r in run["ranks"]]
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
    run = run_of(student, "two_ranks", "called on 2 ranks")
    finals = [r["final"] for r in run["ranks"]]
    ddp, single = reference["ddp"]["two_ranks"][0], reference["single"]["two_ranks"]
    if all(close(f, ddp, atol=PARAM_ATOL) and close(f, single, atol=PARAM_ATOL) for f in finals):
        return None
    if not close(finals[0], finals[1], atol=PARAM_ATOL):
        return (f"After {STEPS} steps of data-parallel training the 2 ranks hold different parameters: every rank "
                "must step with the same (averaged) gradient.")
    return (f"After {STEPS} steps on 2 ranks the parameters match neither DistributedDataParallel nor one process "
            "on the full batch.")


def _flat_or_empty(grads) -> list:
    return [v for g in grads if g is not None for v in g] if isinstance(grads, list) else []


def needs_evidence(test, key: str, what: str):
    """Award a check that compares the observation with itself (ranks with ranks, after with before) only
    when its scenario carries data evidence: each rank's first local gradient, computed by the harness
    before the student's function ran, equals the reference's. An invented observation cannot match it."""
    def checked(student, reference):
        problem = test(student, reference)
        if problem:
            return problem
        got, want = run_of(student, key, what)["ranks"], reference["scenarios"][key]["ranks"]
        if len(got) != len(want) or not all(
                close(_flat_or_empty(g["calls"][0]["grads_before"]), _flat_or_empty(w["calls"][0]["grads_before"]),
                      atol=GRAD_ATOL) for g, w in zip(got, want)):
            return "This could not be confirmed: the ranks' own gradients differ from the grader's seeded problem."
        return None
    return checked


TWO = ("two_ranks", "called on 2 ranks")
EXERCISE = Exercise(
    name="average_gradients",
    notebook="03_data_parallel.ipynb",
    observe=observe,
    observe_reference=observe_reference,
    timeout_s=60,  # three launches; a deadlocking submission spends LAUNCH_TIMEOUT_S in each
    checks=[
        Check("Every rank holds the same gradients after the call (all-reduce, not reduce)", 2,
              needs_evidence(check_same_on_every_rank, *TWO)),
        Check("The gradient is the average: the sum over ranks divided by the world size (2 ranks)", 2,
              needs_evidence(check_average_two, *TWO)),
        Check("Uses the real world size (3 ranks)", 2, check_world_size),
        Check("Changes the gradients only, never the parameters", 1, needs_evidence(check_params_untouched, *TWO)),
        Check("Leaves parameters without a gradient alone (frozen bias, unused layer)", 2,
              needs_evidence(check_no_grad_params, "no_grad_params",
                             "the model has an unused layer and a frozen bias (their .grad is None)")),
        Check("Training with it matches DDP and one process on the full batch (2 ranks)", 2, check_matches_ddp),
    ],
)
