"""Observing ``MiniFSDP`` on real ranks: seeded training, measured by the grader's own hooks."""
import math

import torch
import torch._dynamo  # noqa: F401  torch.optim and FSDP import it lazily (seconds): here, once, not per rank
import torch.distributed as dist
from torch import nn

from ..beside.gating import GradientGate, in_launcher, replay
from ..beside.meter import SampleAtGates
from ..beside.observing import tensor_data
from ..beside.ranks import observe_on_ranks, student_call
from .cases import BATCH, LR, MEMORY_BATCH, cases


def make_model(case: dict) -> nn.Sequential:
    torch.manual_seed(case["model_seed"])
    a, b, c, d = case["sizes"]
    return nn.Sequential(nn.Linear(a, b), nn.Tanh(), nn.Linear(b, c), nn.Tanh(), nn.Linear(c, d))


def batches(case: dict, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(case["data_seed"] * 31 + rank)
    a, d = case["sizes"][0], case["sizes"][-1]
    return [(torch.randn(BATCH, a, generator=generator), torch.randint(0, d, (BATCH,), generator=generator))
            for _ in range(case["steps"])]


def loss_of(output, target):
    return nn.functional.cross_entropy(output.float(), target)


def global_grad_norm(grads) -> float:
    """The L2 norm of the whole model's gradient, from each rank's gradient shards, summed on their device (NCCL
    all-reduces nothing else)."""
    device = next((g.device for g in grads if g is not None), torch.device("cpu"))
    squares = torch.zeros((), dtype=torch.float64, device=device)
    for g in grads:
        if g is not None:  # accumulated in float64 without a float64 copy of the gradient
            squares += torch.linalg.vector_norm(g.detach(), dtype=torch.float64).square()
    dist.all_reduce(squares)
    return math.sqrt(float(squares))


def uses_torch_fsdp(*modules) -> bool:
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    return any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) or
               any(isinstance(p, DTensor) for p in m.parameters(recurse=False))
               for module in modules for m in module.modules())


# ---- measuring what the wrapper holds -------------------------------------------------------

def _tensors_in(value, depth=0):
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 3 and isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors_in(v, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v, depth + 1)


def held_bytes(wrapper: nn.Module, model: nn.Module, *, grads: bool) -> int:
    """Bytes of distinct storages reachable from the wrapper and the model's modules: their parameters,
    buffers and tensor attributes (in lists and dicts too), and with ``grads`` the parameters' gradients.
    What autograd saved for backward is not counted: a minimal FSDP keeps it (FSDP2 gathers again instead)."""
    seen, total = set(), 0
    modules = {id(m): m for root in (wrapper, model) for m in root.modules()}
    for m in modules.values():
        for t in _tensors_in(list(vars(m).values())):
            found = [t] + ([t.grad] if grads and t.grad is not None else [])
            for x in found:
                storage = x.untyped_storage()
                key = (storage.data_ptr(), storage.nbytes())
                if key not in seen:
                    seen.add(key)
                    total += storage.nbytes()
    return total


def materialised_layers(layers: list[nn.Module], names: list[list[str]]) -> list[int]:
    """Which layers hold their full parameters right now (as attributes of the child module)."""
    found = []
    for i, (layer, layer_names) in enumerate(zip(layers, names)):
        values = [getattr(layer, n, None) for n in layer_names]
        if all(isinstance(v, torch.Tensor) and v.untyped_storage().nbytes() > 0 for v in values):
            found.append(i)
    return found


def gated_model(case: dict) -> nn.Sequential:
    """Linear layers with Tanh, and the grader's gate after every layer but the last."""
    torch.manual_seed(case["model_seed"])
    sizes, layers = case["sizes"], []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers += [nn.Linear(a, b), nn.Tanh()] + ([GradientGate()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def memory_input(case: dict, rank: int) -> torch.Tensor:
    return torch.randn(MEMORY_BATCH, case["sizes"][0], generator=torch.Generator().manual_seed(case["data_seed"] + rank))


def memory_loss(output: torch.Tensor) -> torch.Tensor:
    return output.float().square().mean()


def expected_gates(case: dict):
    """The launcher's recomputation of each rank's gates (meter.GatePolicy.expect): the plain gated model's
    backward on that rank's input, each gate answered with the seed the rank was given."""
    def expect(seeds: list[list[int]]) -> dict:
        found, model = [], gated_model(case)  # the same weights on every rank
        for rank, rank_seeds in enumerate(seeds):
            x = memory_input(case, rank)
            found.append(replay(lambda: memory_loss(model(x)).backward(), rank_seeds))
        return {"digests": found}
    return in_launcher(expect)


def memory_rank(rank: int, world_size: int, cls, case: dict) -> dict:
    """One step through the gated model: at each gate in backward the launcher reads what this rank holds
    (SampleAtGates). Recorded here: the loss and the gradient shards' norm (the evidence of the real work)."""
    wrapper = student_call(cls, gated_model(case))
    shards = [p for p in wrapper.parameters() if p.requires_grad]
    loss = memory_loss(student_call(wrapper, memory_input(case, rank)))
    student_call(loss.backward)
    student_call(wrapper.finish_gradient_synchronization)
    return {"loss": float(loss), "grad_norm": global_grad_norm([p.grad for p in shards])}


def gates_of(case: dict):
    if not case["gated"]:
        return None
    return SampleAtGates(case["world_size"], gates=len(case["sizes"]) - 2, expect=expected_gates(case))


def student_rank(rank: int, world_size: int, cls, case: dict) -> dict:
    """One rank trains the seeded model with the student's wrapper, measured by the grader's hooks."""
    if case["gated"]:
        return memory_rank(rank, world_size, cls, case)
    model = make_model(case)
    layers = [m for m in model if list(m.parameters(recurse=False))]
    names = [[n for n, _ in m.named_parameters(recurse=False)] for m in layers]
    dtype = getattr(torch, case["param_dtype"]) if case["param_dtype"] else None
    wrapper = student_call(cls, model, param_dtype=dtype)
    if uses_torch_fsdp(wrapper, model):
        return {"forbidden": True}
    between = []  # per step: per layer, at its forward pre-hook: [held bytes, layers materialised]
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(
            lambda module, args, i=i: between[-1].append(
                [i, held_bytes(wrapper, model, grads=False), materialised_layers(layers, names)]))
    shards = [p for p in wrapper.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(shards, lr=LR)
    record = {"shard_numel": sum(p.numel() for p in shards),
              "shard_dtypes": sorted({str(p.dtype) for p in shards}),
              "losses": [], "grad_norms": [], "between": [], "after_sync": [], "after_step": []}
    for x, y in batches(case, rank):
        optimizer.zero_grad(set_to_none=True)
        between.append([])
        loss = loss_of(student_call(wrapper, x), y)
        student_call(loss.backward)
        student_call(wrapper.finish_gradient_synchronization)
        record["after_sync"].append(held_bytes(wrapper, model, grads=True))
        record["losses"].append(float(loss))
        record["grad_norms"].append(global_grad_norm([p.grad for p in shards]))
        optimizer.step()
        record["after_step"].append(held_bytes(wrapper, model, grads=False))
    record["between"] = between
    full = student_call(wrapper.gather_full_params)
    record["full_params"] = {str(k): [str(v.dtype), tensor_data(v)] for k, v in dict(full).items()
                             if isinstance(v, torch.Tensor)}
    return record


def fsdp2_rank(rank: int, world_size: int, case: dict) -> dict:
    """The same training with torch's FSDP2 (fully_shard on every child with parameters, then the root)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = make_model(case)
    dtype = getattr(torch, case["param_dtype"]) if case["param_dtype"] else None
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
    for layer in model:
        if list(layer.parameters()):
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    record = {"losses": [], "grad_norms": []}
    for x, y in batches(case, rank):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model(x), y)
        loss.backward()
        record["losses"].append(float(loss))
        record["grad_norms"].append(global_grad_norm([p.grad.to_local() for p in model.parameters()]))
        optimizer.step()
    record["full_params"] = {n: tensor_data(p.full_tensor()) for n, p in model.named_parameters()}
    return record


# ---- observing: real processes ---------------------------------------------------------------

def observe(fn, *, salt: int = 0) -> dict:
    # quiet: gloo's own abort message on mismatched collectives would reach the notebook's stderr
    return observe_on_ranks(salt, cases(salt), student_rank, fn, gates=gates_of, quiet=True)


def reference_rank(rank: int, world_size: int, cls, case: dict) -> dict:
    """The reference's rank: the solution's training, then FSDP2's on the same ranks (one launch, not two); in the
    memory scenario only the solution's (its measurement is the measure there)."""
    if case["gated"]:
        return student_rank(rank, world_size, cls, case)
    return {**student_rank(rank, world_size, cls, case), "fsdp2": fsdp2_rank(rank, world_size, case)}


def observe_reference(fn, *, salt: int = 0) -> dict:
    import torch.distributed.fsdp  # noqa: F401  imported once here, not in every forked rank (seconds)

    result = observe_on_ranks(salt, cases(salt), reference_rank, fn, timeout=60, gates=gates_of, quiet=True)
    result["fsdp2"] = {}
    for name, observed in result["scenarios"].items():
        if "ranks" not in observed:
            raise RuntimeError(f"the reference MiniFSDP failed when {observed['case']['what']}: {observed['error']}")
        if not observed["case"]["gated"]:
            result["fsdp2"][name] = [r.pop("fsdp2") for r in observed["ranks"]]
    return result
