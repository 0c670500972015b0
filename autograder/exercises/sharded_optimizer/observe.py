"""Observing ``ShardedOptimizer`` on real ranks: the same seeded gradients on every rank, a few steps."""
import sys
from types import ModuleType

import torch
import torch._dynamo  # noqa: F401  torch.optim imports it lazily (3–6 s): here, once, not in every forked rank
from torch import nn

from ..beside.gating import in_launcher, step_seed
from ..beside.meter import SampleAtGates
from ..beside.observing import tensor_data
from ..beside.ranks import ask_gate, digest, observe_on_ranks, run_on_ranks, student_call, trim_memory
from .cases import BATCH, HIDDEN, IN, LARGE_SHAPE, LARGE_TENSORS, OUT, cases

OPTIMIZERS = {           # name: (class, keyword arguments)
    "AdamW": (torch.optim.AdamW, {"lr": 0.01, "betas": (0.9, 0.99), "weight_decay": 0.1}),
    "SGD": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
}


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


def seeded_edges(shape, generator: torch.Generator, std: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The seeded draws a matrix of ``seeded_values`` is made of: a column (one per row) and a row (one per column)."""
    rows, cols = shape
    scale = std / 2 ** 0.5
    return torch.randn(rows, 1, generator=generator) * scale, torch.randn(1, cols, generator=generator) * scale


def seeded_values(out: torch.Tensor, generator: torch.Generator, std: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded values written into ``out`` (a matrix) at the cost of its edges: a normal draw per row plus one per
    column, so every element differs and each is normal with ``std``. Drawing every element costs 20 times more,
    times 4 ranks, for values whose distribution nothing here needs. Returns the edges (``step_digest``)."""
    edges = seeded_edges(out.shape, generator, std)
    torch.add(*edges, out=out)
    return edges


def step_digest(params: list[torch.Tensor], edges: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """What a rank reports at the gate after a step: each parameter projected on the step's gradient (from its edges:
    rows · row sums + columns · column sums, float64). An AdamW step moves every element against its gradient, so
    the projection tells a step on these gradients from one on any others, which a sum or a norm cannot."""
    found = [float(rows.double().flatten() @ p.detach().sum(dim=1).double())
             + float(cols.double().flatten() @ p.detach().sum(dim=0).double()) for p, (rows, cols) in zip(params, edges)]
    return torch.tensor(found, dtype=torch.float64)


def large_params(case: dict) -> list[nn.Parameter]:
    """The memory scenario's parameters: seeded, the same on every rank."""
    generator = torch.Generator().manual_seed(case["model_seed"])
    return [nn.Parameter(torch.add(*seeded_edges(LARGE_SHAPE, generator, 0.02))) for _ in range(LARGE_TENSORS)]


def checksum(p: torch.Tensor) -> list[float]:
    """A large matrix in two numbers that every element moves: its sum and its norm, over its rows' sums and norms
    in float64 (a float64 copy of the whole would cost 20 times more, its fresh pages most of it)."""
    t = p.detach()
    return [float(t.sum(dim=1).double().sum()), float(torch.linalg.vector_norm(t, dim=1).double().norm())]


def memory_rank(rank: int, world_size: int, cls, case: dict, unsharded: bool = False) -> dict:
    """The memory scenario: new seeded gradients (the same on every rank, written in place), then a step, each
    time. After each step the rank stops at a gate, where the launcher reads the memory it holds (meter.py): what
    it keeps between steps, the optimizer's state, without the step's own temporaries (a flat-buffer style needs
    full-size ones, the reference none). The gate's answer, a seed the launcher drew after the fork and gives every
    rank alike, is mixed into the next step's gradients (``gating.step_seed``): what the next gate reads, the
    parameters projected on that step's gradients (``step_digest``), exists only once this gate was answered, and the
    launcher recomputes it (``expected_steps``). Recorded here: every tensor's checksum (the evidence of real steps),
    and for feedback the state bytes. ``unsharded``: the plain optimizer instead of the student's class (the
    reference's measurement of the wrong method)."""
    optimizer_cls, kwargs = OPTIMIZERS[case["optimizer"]]
    params = large_params(case)
    optimizer = optimizer_cls(params, **kwargs) if unsharded else \
        student_call(cls, iter(params), optimizer_cls, **kwargs)
    seed = case["data_seed"]
    for step in range(case["steps"]):
        generator, edges = torch.Generator().manual_seed(seed), []
        for p in params:
            if p.grad is None or p.grad.shape != p.shape:
                p.grad = torch.empty_like(p)
            edges.append(seeded_values(p.grad, generator, 1.0))
        student_call(optimizer.step)
        trim_memory()  # free heap pages lent by the launching process's heap would count as held
        seed = step_seed(case["data_seed"], ask_gate(f"after step {step + 1}", step_digest(params, edges)))
    return {"forbidden": uses_torch_zero(optimizer), "state_bytes": state_bytes(optimizer),
            "checksums": [checksum(p) for p in params]}


def expected_steps(case: dict):
    """The launcher's recomputation (meter.GatePolicy.expect): the plain optimizer's steps on the gradients the seeds
    it answered give (the same for every rank), the digest each gate must report and the checksums after the last
    step. Fused AdamW: the launcher's time is the grading's (a few ms a step on one thread, against 40 for the loop)."""
    optimizer_cls, kwargs = OPTIMIZERS[case["optimizer"]]

    def steps(seeds: list[int]) -> tuple[list[list[float]], list[list[float]]]:
        params = large_params(case)
        optimizer = optimizer_cls(params, **kwargs, **({"fused": True} if optimizer_cls is torch.optim.AdamW else {}))
        digests, seed = [], case["data_seed"]
        for step in range(len(seeds)):
            generator = torch.Generator().manual_seed(seed)
            edges = []
            for p in params:
                p.grad = torch.empty_like(p)
                edges.append(seeded_values(p.grad, generator, 1.0))
            optimizer.step()
            digests.append(digest(step_digest(params, edges)))
            seed = step_seed(case["data_seed"], seeds[step])
        return digests, [checksum(p) for p in params]

    def expect(seeds: list[list[int]]) -> dict:
        done: dict[tuple, tuple] = {}  # the seeds are shared: one recomputation serves every rank
        for rank_seeds in seeds:
            if tuple(rank_seeds) not in done:
                done[tuple(rank_seeds)] = steps(rank_seeds)
        found = [done[tuple(rank_seeds)] for rank_seeds in seeds]
        return {"digests": [f[0] for f in found], "checksums": [f[1] for f in found]}
    return in_launcher(expect)


def sharded_rank(rank: int, world_size: int, cls, case: dict, with_unsharded: bool = False) -> dict:
    """One rank: the student's optimizer on the seeded problem; rank 0 of the reference also runs the unsharded
    optimizer on the same gradients (the ground truth)."""
    if case["model"] == "large":
        return memory_rank(rank, world_size, cls, case)
    optimizer_cls, kwargs = OPTIMIZERS[case["optimizer"]]
    model = make_model(case)
    initial = tensors(model)
    params, added = param_groups(case, model)
    optimizer = student_call(cls, params, optimizer_cls, **kwargs)
    steps = train(case, model, optimizer, added, student_call)
    result = {"initial": initial, "steps": steps, "state_bytes": state_bytes(optimizer),
              "forbidden": uses_torch_zero(optimizer)}
    if with_unsharded and rank == 0:
        model = make_model(case)
        params, added = param_groups(case, model)
        plain = optimizer_cls(params, **kwargs)
        steps = train(case, model, plain, added, lambda f, *a: f(*a))
        result["unsharded"] = {"steps": steps, "state_bytes": state_bytes(plain),
                               "per_param_bytes": per_param_state_bytes(plain, model)}
    return result


# ---- observing: real processes ---------------------------------------------------------------

def reference_rank(rank: int, world_size: int, cls, case: dict) -> dict:
    return sharded_rank(rank, world_size, cls, case, with_unsharded=True)


def gates_of(case: dict):
    if case["model"] != "large":
        return None
    return SampleAtGates(case["world_size"], gates=case["steps"], expect=expected_steps(case), shared=True)


def observe(fn, *, salt: int = 0) -> dict:
    return observe_on_ranks(salt, cases(salt), sharded_rank, fn, gates=gates_of)


def unsharded_memory_rank(rank: int, world_size: int, cls, case: dict) -> dict:
    return memory_rank(rank, world_size, cls, case, unsharded=True)


def unsharded_memory(fn, case: dict) -> dict:
    """The memory scenario with the plain, unsharded optimizer on every rank, measured the same way: what its ranks
    hold between steps (the wrong method's, for the threshold). Its parameters after the second step depend on the
    launcher's seeds; every observation's own are its meter's recomputation (``expected_steps``)."""
    found = run_on_ranks(unsharded_memory_rank, case["world_size"], fn, case, gates=gates_of(case))
    if "error" in found:
        raise RuntimeError(f"the unsharded optimizer failed when {case['what']}: {found['error']}")
    return {"meter": found["meter"]}


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe_on_ranks(salt, cases(salt), reference_rank, fn, gates=gates_of)
    for observed in result["scenarios"].values():
        if "ranks" not in observed:
            raise RuntimeError(f"the reference ShardedOptimizer failed when {observed['case']['what']}: "
                               f"{observed['error']}")
        if observed["case"]["model"] == "large":
            observed["truth"] = unsharded_memory(fn, observed["case"])
        else:
            observed["truth"] = observed["ranks"][0].pop("unsharded")  # reference-only: never read from a student
    return result
