"""Lesson 4 exercise: ``TensorParallelMLP(fc1, fc2)``, Megatron-LM's tensor-parallel MLP.

The student's class takes the full layers ``fc1: Linear(d_in, h)`` and ``fc2: Linear(h, d_out)`` (the same on
every rank; ``h`` divisible by the world size N) and keeps only this rank's shards: rows
``[r·h/N, (r+1)·h/N)`` of ``fc1.weight`` and ``fc1.bias`` (column-parallel), the same columns of ``fc2.weight``
(row-parallel) and the whole ``fc2.bias``, added once after the sum. ``forward(x)`` returns
``fc2(gelu(fc1(x)))`` on every rank, with Megatron's two operators as autograd functions: f (identity forward,
all-reduce backward) before the first layer, g (all-reduce forward, identity backward) after the second.

The grader really runs it: 2 and 3 forked local processes (gloo over loopback, ``coursekit.dist.launch``).
Each rank builds the same seeded layers, input and upstream gradient, constructs the student's module, runs
one forward and one backward, and records its output, ``x.grad``, its shards (found among the module's
parameters by their shapes) and their gradients. The grader's own instrumentation counts the collectives in
the forward and in the backward: torch's profiler records every gloo collective (``gloo:all_reduce``, …)
whichever Python API issued it (``dist.all_reduce``, async work, functional collectives). The reference
observation adds the single-process MLP's output and gradients, sliced per rank, which the checks compare with.

Not allowed: ``torch.distributed.tensor`` (``parallelize_module``, DTensor). It does the whole exercise for
you; a module whose parameters or output are DTensors earns no points (the lesson says so).
"""
import warnings

import torch
from torch import nn

import coursekit  # noqa: F401  keeps the profiler's back end quiet on stderr (KINETO_LOG_LEVEL)

from ..exercise import (
    Check,
    Exercise,
    ScenarioError,
    case,
    close,
    held_out_rng,
    observation,
    run_on_ranks,
    salted_seed,
    scenario,
    student_call,
    tensor_data,
    what,
)

LAUNCH_TIMEOUT_S = 8.0  # a correct run takes well under a second
ATOL = 1e-5             # float32 round-off between valid styles (F.linear vs matmul, order of the sum)
ROLES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")

SCENARIOS = {  # name: (world size, what it is: the words after "when")
    "two_ranks": (2, "called on 2 ranks"),
    "three_ranks": (3, "called on 3 ranks"),
}
PUBLIC_SIZES = {"d_in": 6, "per_rank": 4, "d_out": 3, "batch": 4}  # hidden size = per_rank × world size


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs. Held-out salts draw other sizes (every shard shape stays distinct: per_rank >
    d_out, so the grader can tell the module's parameters apart by shape) and other seeds."""
    found = {}
    for i, (name, (world_size, words)) in enumerate(SCENARIOS.items()):
        if salt == 0:
            sizes = dict(PUBLIC_SIZES)
        else:
            rng = held_out_rng(salt, f"sizes of {name}")
            sizes = {"d_in": rng.randint(5, 8), "per_rank": rng.randint(4, 6), "d_out": rng.randint(2, 3),
                     "batch": rng.randint(3, 6)}
        found[name] = {"what": words, "world_size": world_size, **sizes,
                       "hidden": sizes["per_rank"] * world_size, "seed": salted_seed(100 + i, salt)}
    return found


# ---- the problem every rank builds ---------------------------------------------------------------

def make_problem(case: dict):
    """The full layers, the input and the upstream gradient: identical on every rank (same seed)."""
    torch.manual_seed(case["seed"])
    fc1, fc2 = nn.Linear(case["d_in"], case["hidden"]), nn.Linear(case["hidden"], case["d_out"])
    x = torch.randn(case["batch"], case["d_in"])
    upstream = torch.randn(case["batch"], case["d_out"])  # dL/dy: the loss is (y · upstream).sum()
    return fc1, fc2, x, upstream


def shard_shapes(case: dict) -> dict[str, tuple[int, ...]]:
    k, d_in, d_out = case["per_rank"], case["d_in"], case["d_out"]
    return {"fc1.weight": (k, d_in), "fc1.bias": (k,), "fc2.weight": (d_out, k), "fc2.bias": (d_out,)}


def expected_shards(full: dict[str, torch.Tensor], rank: int, case: dict) -> dict[str, torch.Tensor]:
    """This rank's slice of each full tensor (a parameter or its gradient): Megatron's contiguous blocks."""
    rows = slice(rank * case["per_rank"], (rank + 1) * case["per_rank"])
    return {"fc1.weight": full["fc1.weight"][rows], "fc1.bias": full["fc1.bias"][rows],
            "fc2.weight": full["fc2.weight"][:, rows], "fc2.bias": full["fc2.bias"]}


def single_process(case: dict) -> dict:
    """The unsplit MLP in one process: its output, x.grad, and every rank's slice of its parameters and grads."""
    fc1, fc2, x, upstream = make_problem(case)
    x.requires_grad_(True)
    y = fc2(nn.functional.gelu(fc1(x)))
    (y * upstream).sum().backward()
    params = {"fc1.weight": fc1.weight, "fc1.bias": fc1.bias, "fc2.weight": fc2.weight, "fc2.bias": fc2.bias}
    values = {role: p.detach() for role, p in params.items()}
    grads = {role: p.grad for role, p in params.items()}
    return {"output": tensor_data(y), "x_grad": tensor_data(x.grad),
            "shards": [{role: {"value": tensor_data(v), "grad": tensor_data(g)}
                        for (role, v), g in zip(expected_shards(values, r, case).items(),
                                                expected_shards(grads, r, case).values())}
                       for r in range(case["world_size"])]}


# ---- observing: real processes, the grader's own count of collectives ---------------------------

def collectives(prof) -> dict[str, int]:
    """Every gloo collective the profiler saw, by kind: {"all_reduce": 1, ...}."""
    counts: dict[str, int] = {}
    for event in prof.events():
        if event.name.startswith("gloo:"):
            kind = event.name.removeprefix("gloo:")
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def find_shards(module, case: dict) -> dict[str, torch.Tensor | None]:
    """The module's parameter for each role, found by its shape (names are the student's choice). Where two
    parameters fit one role (a kept copy of the full fc2, say), the one that received a gradient wins."""
    params = list({id(p): p for p in module.parameters()}.values()) if isinstance(module, nn.Module) else []
    found = {}
    for role, shape in shard_shapes(case).items():
        fitting = [p for p in params if tuple(p.shape) == shape]
        found[role] = next((p for p in fitting if p.grad is not None), fitting[0] if fitting else None)
    return found


def uses_dtensor(module, output) -> bool:
    from torch.distributed.tensor import DTensor

    params = list(module.parameters()) if isinstance(module, nn.Module) else []
    return isinstance(output, DTensor) or any(isinstance(p, DTensor) for p in params)


def checked_output(y, case: dict):
    """forward's result, or a ValueError in the student's words when it is not the full output."""
    want = (case["batch"], case["d_out"])
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != want:
        got = f"shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"forward(x) returned {got}, not the full output of shape {want}")
    return y


def tensor_parallel_rank(rank: int, world_size: int, cls, case: dict) -> dict:
    """One rank: build the student's module from the full layers, one forward and one backward, counted."""
    from torch.profiler import ProfilerActivity, profile

    warnings.simplefilter("ignore")  # a rank's warnings would reach the notebook's stderr
    fc1, fc2, x, upstream = make_problem(case)
    module = student_call(cls, fc1, fc2)
    x.requires_grad_(True)
    with profile(activities=[ProfilerActivity.CPU]) as forward_prof:
        y = student_call(module, x)
    if uses_dtensor(module, y):
        return {"dtensor": True}
    y = student_call(checked_output, y, case)
    with profile(activities=[ProfilerActivity.CPU]) as backward_prof:
        student_call((y * upstream).sum().backward)
    shards = find_shards(module, case)
    return {"output": tensor_data(y), "x_grad": None if x.grad is None else tensor_data(x.grad),
            "shards": {role: None if p is None else
                       {"value": tensor_data(p), "grad": None if p.grad is None else tensor_data(p.grad)}
                       for role, p in shards.items()},
            "forward": collectives(forward_prof), "backward": collectives(backward_prof)}


def warm_profiler() -> None:
    """The profiler's first start costs about 1.5 s; once here, not in every forked rank."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        torch.zeros(1).add_(1)


def observe(fn, *, salt: int = 0) -> dict:
    warm_profiler()
    return observation(salt, cases(salt), lambda case: run_on_ranks(
        tensor_parallel_rank, case["world_size"], fn, case, timeout=LAUNCH_TIMEOUT_S))


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    result["single"] = {name: single_process(s["case"]) for name, s in result["scenarios"].items()}
    return result


# ---- reading an observation (plain Python only: no torch from here on) ---------------------------

DTENSOR = ("Your module uses torch.distributed.tensor (parallelize_module or DTensor), which does this exercise for "
           "you: split the layers and write f and g yourself, as the lesson asks, to earn the points.")


def ranks_of(student: dict, reference: dict, key: str) -> list[dict]:
    """The scenario's per-rank records, or a ScenarioError with one sentence for the student."""
    try:
        ranks = scenario(student, key, what(reference, key))["ranks"]
    except ScenarioError as exc:
        if "shapes cannot be multiplied" in str(exc):  # the classic: slicing the weight along the wrong dimension
            raise ScenarioError(f"{exc} nn.Linear's weight is (out_features, in_features): fc1 keeps a block of rows, "
                                "fc2 the same block of columns.") from None
        raise
    if any(r.get("dtensor") for r in ranks):
        raise ScenarioError(DTENSOR)
    return ranks


def single(reference: dict, key: str) -> dict:
    return reference["single"][key]


def shard_grads_problem(ranks: list[dict], want: dict, label: str) -> str | None:
    for rank, (r, w) in enumerate(zip(ranks, want["shards"])):
        for role in ROLES:
            got = r["shards"][role]
            if got is None:
                return (f"{label}, rank {rank} holds no parameter shaped like its shard of {role}: keep the shards as "
                        "parameters (nn.Parameter) with the shapes the docstring gives.")
            if got["grad"] is None:
                return (f"{label}, rank {rank}'s shard of {role} got no gradient: compute with the shard parameters "
                        "themselves, so that backward() reaches them.")
            if not close(got["grad"], w[role]["grad"], atol=ATOL, rtol=1e-4):
                return (f"{label}, rank {rank}'s gradient of its {role} shard is not its slice of the single-process "
                        "gradient: check which slice it holds, and that g's backward passes dL/dy on unchanged.")
    return None


def outputs_problem(ranks: list[dict], want: dict, label: str) -> str | None:
    for rank, r in enumerate(ranks):
        if not close(r["output"], want["output"], atol=ATOL, rtol=1e-4):
            return (f"{label}, rank {rank}'s output differs from the single-process MLP's: sum the partial outputs over "
                    "the ranks once (g), then add fc2's bias once.")
    return None


def x_grad_problem(ranks: list[dict], want: dict, label: str) -> str | None:
    for rank, r in enumerate(ranks):
        if r["x_grad"] is None:
            return (f"{label}, x.grad is None on rank {rank}: the input's gradient must flow back through your "
                    "autograd functions (an all-reduce outside autograd cuts the graph).")
        if not close(r["x_grad"], want["x_grad"], atol=ATOL, rtol=1e-4):
            return (f"{label}, rank {rank}'s x.grad is not the single-process input gradient: each rank holds only its "
                    "shard's part of it, so f's backward must sum it over the ranks.")
    return None


def columns(flat: list, rows: int, cols: int) -> list[list[float]]:
    """The columns of a row-major (rows × cols) matrix given as a flat list."""
    return [[float(flat[i * cols + j]) for i in range(rows)] for j in range(cols)]


def shards_really_computed(got: dict, want: dict) -> str | None:
    """The evidence: every rank holds an fc2.weight-shaped shard whose gradient's columns are columns of the
    single-process gradient (each one needs the real GELU activation of one hidden unit of the seeded problem and
    the real upstream gradient). A count, and an output that the unsplit MLP on every rank also gets right, are
    believed only with it."""
    c = want["case"]
    d_out, k = c["d_out"], c["per_rank"]
    true_columns = [col for w in want["ranks"] for col in columns(w["shards"]["fc2.weight"]["grad"], d_out, k)]
    ranks = got.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != len(want["ranks"]):
        return f"when {c['what']}, the grader found no results for every rank."
    for r in ranks:
        mine = (r.get("shards") or {}).get("fc2.weight") or {}
        grad = mine.get("grad")
        if not isinstance(grad, list) or len(grad) != d_out * k or not all(
                any(close(col, true, atol=ATOL, rtol=1e-4) for true in true_columns)
                for col in columns(grad, d_out, k)):
            return (f"when {c['what']}, the ranks hold no fc2.weight shard (shape (d_out, h/N)) whose gradient comes "
                    "from the grader's seeded problem: each rank must compute with its own shards.")
    return None


# ---- the checks ----------------------------------------------------------------------------------

def check_shards(student, reference):
    c = case(reference, "two_ranks")
    want = single(reference, "two_ranks")
    for rank, r in enumerate(ranks_of(student, reference, "two_ranks")):
        for role in ROLES:
            got = r["shards"][role]
            if got is None or not close(got["value"], want["shards"][rank][role]["value"], atol=0.0):
                part = {"fc1.weight": "rows (output features) of fc1.weight",
                        "fc1.bias": "entries of fc1.bias", "fc2.weight": "columns (input features) of fc2.weight",
                        "fc2.bias": "whole fc2.bias"}[role]
                if role == "fc2.bias":
                    return (f"On {c['world_size']} ranks, rank {rank} does not keep the whole fc2.bias, unchanged, "
                            "as a parameter: keep all of it and add it once, after g.")
                return (f"On {c['world_size']} ranks, rank {rank} does not keep the {part} (block {rank} of "
                        f"{c['world_size']}, contiguous) as a parameter: nn.Linear's weight is (out_features, "
                        "in_features), so column-parallel fc1 splits its rows.")
    return None


def check_output(student, reference):
    return outputs_problem(ranks_of(student, reference, "two_ranks"), single(reference, "two_ranks"),
                           f"On {case(reference, 'two_ranks')['world_size']} ranks")


def check_x_grad(student, reference):
    return x_grad_problem(ranks_of(student, reference, "two_ranks"), single(reference, "two_ranks"),
                          f"On {case(reference, 'two_ranks')['world_size']} ranks")


def check_weight_grads(student, reference):
    return shard_grads_problem(ranks_of(student, reference, "two_ranks"), single(reference, "two_ranks"),
                               f"On {case(reference, 'two_ranks')['world_size']} ranks")


def check_three_ranks(student, reference):
    ranks, want = ranks_of(student, reference, "three_ranks"), single(reference, "three_ranks")
    label = f"On {case(reference, 'three_ranks')['world_size']} ranks"
    return outputs_problem(ranks, want, label) or x_grad_problem(ranks, want, label) or \
        shard_grads_problem(ranks, want, label)


def count_problem(student, reference, phase: str, words: str) -> str | None:
    for key in reference["scenarios"]:
        n = case(reference, key)["world_size"]
        for rank, r in enumerate(ranks_of(student, reference, key)):
            counts = r[phase]
            all_reduces = int(counts.get("all_reduce", 0))
            others = sorted(kind for kind, count in counts.items() if kind != "all_reduce" and int(count))
            if all_reduces != 1 or others:
                extra = f" and {', '.join(others)}" if others else ""
                return (f"On {n} ranks, rank {rank}'s {words} ran {all_reduces} all-reduce(s){extra}, not exactly "
                        f"one all-reduce: {'g' if phase == 'forward' else 'f'} should do it, "
                        f"{'f' if phase == 'forward' else 'g'} none.")
    return None


def check_forward_count(student, reference):
    return count_problem(student, reference, "forward", "forward pass")


def check_backward_count(student, reference):
    return count_problem(student, reference, "backward", "backward pass")


EXERCISE = Exercise(
    name="TensorParallelMLP",
    notebook="04_model_pipeline_parallel.ipynb",
    observe=observe,
    observe_reference=observe_reference,
    evidence=shards_really_computed,
    timeout_s=45,  # two launches; a deadlocking submission spends LAUNCH_TIMEOUT_S in each
    checks=[
        Check("Keeps this rank's shards: rows of fc1.weight and fc1.bias, columns of fc2.weight (2 ranks)", 2,
              check_shards),
        Check("The output equals the single-process MLP's on every rank (2 ranks)", 2, check_output,
              evidence=("two_ranks",)),
        Check("x.grad equals the single-process input gradient on every rank (2 ranks)", 2, check_x_grad,
              evidence=("two_ranks",)),
        Check("Each shard's gradient is its slice of the single-process gradient (2 ranks)", 2, check_weight_grads),
        Check("Output, x.grad and shard gradients are right on 3 ranks", 2, check_three_ranks,
              evidence=("three_ranks",)),
        Check("Exactly one all-reduce in the forward pass (g)", 1, check_forward_count,
              evidence=("two_ranks", "three_ranks")),
        Check("Exactly one all-reduce in the backward pass (f)", 1, check_backward_count,
              evidence=("two_ranks", "three_ranks")),
    ],
)
