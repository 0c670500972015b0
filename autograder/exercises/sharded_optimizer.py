"""Lesson 5 exercise: ``ShardedOptimizer``, ZeRO stage 1 written by the student.

``ShardedOptimizer(params, optimizer_cls, **kwargs)`` is a ``torch.optim.Optimizer`` that, on every rank of an
initialised process group, keeps ``optimizer_cls``'s state only for this rank's share of the parameters, steps
only that share, and then shares the updated parameters, so that after ``step()`` every rank holds the same
parameters as one process running ``optimizer_cls`` on all of them. ``add_param_group`` works as for any
optimizer (the hyperparameters of every group are kept).

The grader really runs it: 2 or 3 forked local ranks (gloo, ``coursekit.dist.launch``) build the same seeded
model and give every rank the same gradient (the full batch on every rank, as DDP's all-reduce would leave it),
then step the student's optimizer a few times. Each rank records its parameters after every step and the bytes of
optimizer state its optimizer holds: the tensors (``dim > 0``) in the ``state`` of every ``torch.optim.Optimizer``
reachable from the student's object, itself included. The reference observation adds, on rank 0, the same
training with the unsharded ``optimizer_cls`` (on the same gradients, in the same process): the ground truth.

Not allowed: using ``torch.distributed.optim.ZeroRedundancyOptimizer`` (as the class or inside it). The exercise
is to write the sharding; the lesson measures torch's version next to the student's. Such a submission fails
every check with a sentence that says so.
"""
import sys
import warnings
from types import ModuleType

import torch
import torch._dynamo  # noqa: F401  torch.optim imports it lazily (3–6 s): here, once, not in every forked rank
from torch import nn

from ..exercise import (
    Check,
    Exercise,
    ScenarioError,
    case,
    close,
    observation,
    run_on_ranks,
    salted_seed,
    scenario,
    student_call,
    tensor_data,
)

IN, HIDDEN, OUT, BATCH = 6, 8, 4, 16
STEPS = 3
LAUNCH_TIMEOUT_S = 6.0   # a correct run takes well under a second
PARAM_ATOL = 1e-6        # float32 round-off between valid styles (per tensor or one flat shard)
OPTIMIZERS = {           # name: (class, keyword arguments)
    "AdamW": (torch.optim.AdamW, {"lr": 0.01, "betas": (0.9, 0.99), "weight_decay": 0.1}),
    "SGD": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
}
# name: (world size, optimizer, model, what it is: the words after "when")
SCENARIOS = {
    "adamw_two": (2, "AdamW", "mlp", "AdamW with weight decay runs on 2 ranks"),
    "sgd_three": (3, "SGD", "mlp", "SGD with momentum runs on 3 ranks"),
    "groups": (2, "AdamW", "groups", "two parameter groups with their own lr and weight_decay run on 2 ranks, and a "
               "third group is added with add_param_group after the first step"),
    "few_params": (3, "SGD", "tiny", "a model with 2 parameter tensors runs on 3 ranks (one rank owns nothing)"),
}
ZERO_NOT_ALLOWED = ("Your class uses torch.distributed.optim.ZeroRedundancyOptimizer: this exercise asks you to "
                    "write the sharding yourself (the lesson compares torch's version with yours).")


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs; the seeds are public for salt 0 and held out for any other salt."""
    return {name: {"what": words, "world_size": world_size, "optimizer": optimizer, "model": model,
                   "steps": STEPS, "model_seed": salted_seed(100 + i, salt), "data_seed": salted_seed(200 + i, salt)}
            for i, (name, (world_size, optimizer, model, words)) in enumerate(SCENARIOS.items())}


# ---- the problem every rank trains ----------------------------------------------------------

def make_model(case: dict) -> nn.Module:
    """The same on every rank (same seed). "mlp" has 6 tensors of unequal sizes, "tiny" only 2."""
    torch.manual_seed(case["model_seed"])
    if case["model"] == "tiny":
        return nn.Linear(IN, OUT)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))


def param_groups(case: dict, model: nn.Module):
    """What the optimizer is constructed with, and the group added after the first step (or None).

    "groups": the hidden layers' weights and biases in two groups with their own hyperparameters; the last
    layer joins later through add_param_group, with its own lr. Otherwise: model.parameters(), a generator.
    """
    if case["model"] != "groups":
        return model.parameters(), None
    hidden = [model[0], model[2]]
    return ([{"params": [layer.weight for layer in hidden], "weight_decay": 0.2},
             {"params": [layer.bias for layer in hidden], "weight_decay": 0.0, "lr": 0.02}],
            {"params": list(model[4].parameters()), "lr": 0.005})


def batch(case: dict):
    generator = torch.Generator().manual_seed(case["data_seed"])
    return torch.randn(BATCH, IN, generator=generator), torch.randn(BATCH, OUT, generator=generator)


def set_gradients(model: nn.Module, x, y) -> None:
    """The same full batch on every rank: every rank holds the same (already averaged) gradient."""
    for p in model.parameters():
        p.grad = None
    nn.functional.mse_loss(model(x), y).backward()


def tensors(model: nn.Module) -> list[list[float]]:
    """The parameters, per tensor; 9 significant digits are exact for float32 and keep the shipped file small."""
    return [[float(f"{v:.9g}") for v in tensor_data(p)] for p in model.parameters()]


def state_bytes(optimizer) -> int:
    """Bytes of optimizer state the object holds: in the ``state`` of every torch.optim.Optimizer reachable from
    it (itself included), the tensors with dim > 0 (Adam's step counter is a scalar), each storage once."""
    storages = {}
    for opt in optimizers_in(optimizer):
        state = getattr(opt, "state", None)  # None when a subclass skipped Optimizer.__init__
        for param_state in state.values() if isinstance(state, dict) else ():
            for t in param_state.values() if isinstance(param_state, dict) else ():
                if torch.is_tensor(t) and t.dim() > 0:
                    storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def per_param_state_bytes(optimizer, model: nn.Module) -> list[int]:
    """A plain torch optimizer's state bytes for each parameter tensor (the largest bounds a rank's imbalance)."""
    return [sum(t.numel() * t.element_size() for t in optimizer.state[p].values() if torch.is_tensor(t) and t.dim())
            for p in model.parameters()]


def optimizers_in(root, limit: int = 5000) -> list:
    """Every torch.optim.Optimizer reachable from ``root`` through attributes, lists, tuples, sets and dicts."""
    found, seen, stack = [], set(), [root]
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or torch.is_tensor(obj) or isinstance(obj, (str, bytes, int, float, type, ModuleType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.optim.Optimizer):
            found.append(obj)
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, nn.Module):
            stack.extend(vars(obj).values())
    return found


def uses_torch_zero(optimizer) -> bool:
    """Whether the object is, or holds, torch's ZeroRedundancyOptimizer."""
    module = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    zero = getattr(module, "ZeroRedundancyOptimizer", None)
    return zero is not None and any(isinstance(o, zero) for o in optimizers_in(optimizer))


def train(case: dict, model: nn.Module, optimizer, added_group, step) -> list[list[list[float]]]:
    """``case["steps"]`` steps on the seeded batch; the parameters (per tensor) after every step."""
    x, y = batch(case)
    after = []
    for i in range(case["steps"]):
        if i == 1 and added_group is not None:
            step(optimizer.add_param_group, added_group)
        set_gradients(model, x, y)
        step(optimizer.step)
        after.append(tensors(model))
    return after


def sharded_rank(rank: int, world_size: int, cls, case: dict, with_unsharded: bool) -> dict:
    """One rank: the student's optimizer on the seeded problem; rank 0 of the reference also runs the unsharded
    optimizer on the same gradients (the ground truth)."""
    warnings.simplefilter("ignore")  # a rank's warnings would reach the notebook's stderr
    optimizer_cls, kwargs = OPTIMIZERS[case["optimizer"]]
    model = make_model(case)
    initial = tensors(model)
    params, added = param_groups(case, model)
    optimizer = student_call(cls, params, optimizer_cls, **kwargs)
    steps = train(case, model, optimizer, added, student_call)
    result = {"initial": initial, "steps": steps, "state_bytes": state_bytes(optimizer),
              "uses_torch_zero": uses_torch_zero(optimizer)}
    if with_unsharded and rank == 0:
        model = make_model(case)
        params, added = param_groups(case, model)
        plain = optimizer_cls(params, **kwargs)
        steps = train(case, model, plain, added, lambda f, *a: f(*a))
        result["unsharded"] = {"steps": steps, "state_bytes": state_bytes(plain),
                               "per_param_bytes": per_param_state_bytes(plain, model)}
    return result


# ---- observing: real processes ---------------------------------------------------------------

def observe(fn, *, salt: int = 0, with_unsharded: bool = False) -> dict:
    return observation(salt, cases(salt), lambda case: run_on_ranks(
        sharded_rank, case["world_size"], fn, case, with_unsharded, timeout=LAUNCH_TIMEOUT_S))


def observe_reference(fn, *, salt: int = 0) -> dict:
    return observe(fn, salt=salt, with_unsharded=True)


# ---- checking: plain Python on the observations (no torch from here on) ---------------------

def ranks_of(student, reference, key: str) -> list[dict]:
    """The student's per-rank results for a scenario, one per rank; torch's ZeRO earns nothing."""
    c = case(reference, key)
    ranks = scenario(student, key, c["what"]).get("ranks")
    if not isinstance(ranks, list) or len(ranks) != c["world_size"]:
        raise ScenarioError(f"No result from every rank when {c['what']}: the grader's observation is incomplete.")
    if any(r.get("uses_torch_zero") is not False for r in ranks):
        raise ScenarioError(ZERO_NOT_ALLOWED)
    return ranks


def unsharded(reference, key: str) -> dict:
    return reference["scenarios"][key]["ranks"][0]["unsharded"]


def same(a: list, b: list) -> bool:
    """Two parameter lists (per tensor) equal up to round-off."""
    return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(
        close(x, y, atol=PARAM_ATOL) for x, y in zip(a, b))


def did_real_work(got: dict, want: dict) -> str | None:
    """The evidence: after the first step some rank holds some parameter tensor exactly as the unsharded optimizer
    left it, and that tensor moved: only a real step on the seeded problem gives it. A do-nothing optimizer, or an
    invented observation, has none."""
    want_initial, want_first = want["ranks"][0]["initial"], want["ranks"][0]["unsharded"]["steps"][0]
    for r in got["ranks"]:
        for i, tensor in enumerate(r["steps"][0]):
            if close(tensor, want_first[i], atol=PARAM_ATOL) and not close(tensor, want_initial[i], atol=PARAM_ATOL):
                return None
    return (f"when {want['case']['what']}, no rank holds a parameter that the first step() updated as "
            f"{want['case']['optimizer']} does.")


def training_problem(student, reference, key: str) -> str | None:
    """None when every rank holds the unsharded optimizer's parameters after every step, else what is wrong."""
    c = case(reference, key)
    ranks, want = ranks_of(student, reference, key), unsharded(reference, key)
    initial = reference["scenarios"][key]["ranks"][0]["initial"]
    for i, expected in enumerate(want["steps"]):
        got = [r["steps"][i] for r in ranks]
        if all(same(g, expected) for g in got):
            continue
        differ = next((r for r in range(1, len(got)) if not same(got[r], got[0])), None)
        if differ is not None:
            return (f"When {c['what']}, after step {i + 1} rank 0 and rank {differ} hold different parameters: after "
                    "stepping its share, each rank must send its updated parameters to every other rank (broadcast "
                    "from the owner, or all-gather).")
        stale = [t for t, tensor in enumerate(got[0])
                 if same([tensor], [initial[t]]) and not same([expected[t]], [initial[t]])]
        if stale:
            return (f"When {c['what']}, {len(stale)} of the {len(initial)} parameter tensors were never updated: every "
                    "parameter needs exactly one owner that steps it, and its updated value must come from that owner.")
        return (f"When {c['what']}, after step {i + 1} the parameters differ from {c['optimizer']} run on one process: "
                "each parameter must be stepped once, with its group's hyperparameters, by the rank that owns it.")
    return None


def check_adamw(student, reference):
    return training_problem(student, reference, "adamw_two")


def check_sgd(student, reference):
    return training_problem(student, reference, "sgd_three")


def check_same_everywhere(student, reference):
    for key in ("adamw_two", "sgd_three"):
        c, ranks = case(reference, key), ranks_of(student, reference, key)
        for i in range(c["steps"]):
            for r in range(1, len(ranks)):
                if not same(ranks[r]["steps"][i], ranks[0]["steps"][i]):
                    return (f"When {c['what']}, after step {i + 1} rank 0 and rank {r} hold different parameters: "
                            "after stepping its share, each rank must send its updated parameters to the others.")
    return None


def check_state_is_sharded(student, reference):
    for key in ("adamw_two", "sgd_three"):
        c, ranks, want = case(reference, key), ranks_of(student, reference, key), unsharded(reference, key)
        n, total, largest = c["world_size"], want["state_bytes"], max(want["per_param_bytes"])
        held = [float(r["state_bytes"]) for r in ranks]
        if sum(held) < 0.9 * total:
            return (f"When {c['what']}, the ranks together hold {sum(held) / total:.0%} of the unsharded "
                    f"{c['optimizer']} state: keep each rank's optimizer (optimizer_cls over its share) in an "
                    "attribute of your object, where it keeps the state of every parameter that rank owns.")
        if sum(held) > 1.1 * total:
            return (f"When {c['what']}, the ranks together hold {sum(held) / total:.2g}× the unsharded "
                    f"{c['optimizer']} state: the state of each parameter must live on one rank only, its owner.")
        limit = total / n + (1 - 1 / n) * largest + 64 * n  # whole tensors: greedy by size stays under this
        for r, h in enumerate(held):
            if h > limit:
                return (f"When {c['what']}, rank {r} holds {h / total:.0%} of the optimizer state, far from 1/{n}: "
                        "balance the shares by size (give each tensor, largest first, to the rank with the fewest "
                        "elements so far).")
    return None


def check_groups(student, reference):
    return training_problem(student, reference, "groups")


def check_few_params(student, reference):
    return training_problem(student, reference, "few_params")


EXERCISE = Exercise(
    name="ShardedOptimizer",
    notebook="05_fsdp_zero.ipynb",
    observe=observe,
    observe_reference=observe_reference,
    evidence=did_real_work,
    timeout_s=60,  # four launches; a deadlocking submission spends LAUNCH_TIMEOUT_S in each
    checks=[
        Check("Matches unsharded AdamW with weight decay after several steps (2 ranks)", 2, check_adamw),
        Check("Matches unsharded SGD with momentum after several steps (3 ranks)", 2, check_sgd),
        Check("Every rank holds the same parameters after every step()", 2, check_same_everywhere,
              evidence=("adamw_two", "sgd_three")),
        Check("Each rank keeps optimizer state for about 1/N of the parameters (2 and 3 ranks)", 2,
              check_state_is_sharded, evidence=("adamw_two", "sgd_three")),
        Check("Keeps every parameter group's hyperparameters, also for groups added with add_param_group", 2,
              check_groups),
        Check("Works when there are fewer parameter tensors than ranks (a rank owns nothing)", 1, check_few_params),
    ],
)
