"""Lesson 5 exercise: ``MiniFSDP``, a minimal fully sharded data parallel wrapper.

``MiniFSDP(module: nn.Sequential, param_dtype=None)`` flattens each child's parameters, pads them to a
multiple of the world size and keeps only this rank's shard (fp32); ``forward(*inputs)`` all-gathers a layer
just before it runs (in ``param_dtype`` when given) and frees it after; ``finish_gradient_synchronization()``
leaves in every shard's ``.grad`` its reduce-scattered, averaged gradient; ``gather_full_params()`` returns the
full fp32 state dict on every rank.

The grader trains a small seeded ``nn.Sequential`` with it on 2 and 3 forked ranks (gloo), a few SGD steps on
the shards, and records per rank and step: the loss, the global gradient norm (from the gradient shards), and
the bytes of tensors the wrapper holds, measured by the grader's own forward pre-hooks on every child (between
layers), after each step and after the synchronisation; plus ``gather_full_params()`` at the end. The reference
observation adds the same training with torch's FSDP2 (``fully_shard`` on every child and the root, also on
gloo/CPU in torch 2.13), whose losses, gradient norms and parameters the checks compare with.

Calling torch's FSDP (``fully_shard``, ``FullyShardedDataParallel``) inside the wrapper is not an answer to
this exercise: every check says so and it earns nothing (the lesson says it too).
"""
import math
import os
import warnings

import torch
import torch._dynamo  # noqa: F401  torch.optim and FSDP import it lazily (seconds): here, once, not per rank
import torch.distributed as dist
from torch import nn

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

BATCH, STEPS, LR = 4, 3, 0.1
MODEL_SEED, DATA_SEED = 2024, 7
# Public widths of the Linear layers. On 2 ranks every flat layer has an even size (so a wrong padding still
# earns the 2-rank checks); on 3 ranks the flat layers hold 35, 40 and 18 values: two need padding.
SIZES = {2: (5, 6, 4, 2), 3: (4, 7, 5, 3)}
LAUNCH_TIMEOUT_S = 8.0             # a correct run takes well under a second
FP32_RTOL = 1e-5                   # float32 round-off: sum order of a norm, 3-rank averages (2 ranks: exact)
BF16_RTOL = 1e-2                   # bf16 compute: a valid style may round once more or less than FSDP2
PARAM_ATOL = 1e-5                  # fp32 master weights after STEPS steps (bf16 master weights: ~1e-3 off)
SLACK_BYTES = 64                   # bookkeeping a wrapper may hold (a scalar or two)

SCENARIOS = {  # name: (world size, param_dtype, what it is)
    "fp32_two": (2, None, "trained on 2 ranks in float32"),
    "fp32_three": (3, None, "trained on 3 ranks in float32 (a layer's size is not divisible by 3)"),
    "bf16_two": (2, "bfloat16", "trained on 2 ranks with param_dtype=torch.bfloat16"),
}


def _sizes(salt: int, world_size: int) -> list[int]:
    """Widths as in SIZES: on 2 ranks even flat layers; on 3 ranks at least two layers that need padding."""
    if salt == 0:
        return list(SIZES[world_size])
    rng = held_out_rng(salt, f"sizes for {world_size} ranks")
    while True:
        sizes = [rng.randint(3, 6), rng.randint(5, 9), rng.randint(4, 8), rng.randint(2, 4)]
        numels = [(a + 1) * b for a, b in zip(sizes, sizes[1:])]
        if all(n % 2 == 0 for n in numels) if world_size == 2 else sum(n % 3 != 0 for n in numels) >= 2:
            return sizes


def cases(salt: int) -> dict[str, dict]:
    return {name: {"what": words, "world_size": n, "param_dtype": dtype, "sizes": _sizes(salt, n), "steps": STEPS,
                   "model_seed": salted_seed(MODEL_SEED, salt), "data_seed": salted_seed(DATA_SEED, salt)}
            for name, (n, dtype, words) in SCENARIOS.items()}


# ---- the problem every rank trains ----------------------------------------------------------

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


def layer_numels(case: dict) -> list[int]:
    sizes = case["sizes"]
    return [(a + 1) * b for a, b in zip(sizes, sizes[1:])]


def global_grad_norm(grads) -> float:
    """The L2 norm of the whole model's gradient, from each rank's gradient shards."""
    squares = torch.zeros((), dtype=torch.float64)
    for g in grads:
        if g is not None:
            squares += g.detach().double().pow(2).sum()
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


def student_rank(rank: int, world_size: int, cls, case: dict) -> dict:
    """One rank trains the seeded model with the student's wrapper, measured by the grader's hooks."""
    warnings.simplefilter("ignore")  # a rank's warnings would reach the notebook's stderr, and so would
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # gloo's own abort message on mismatched collectives
    model = make_model(case)
    layers = [m for m in model if list(m.parameters(recurse=False))]
    names = [[n for n, _ in m.named_parameters(recurse=False)] for m in layers]
    dtype = getattr(torch, case["param_dtype"]) if case["param_dtype"] else None
    wrapper = student_call(cls, model, param_dtype=dtype)
    if uses_torch_fsdp(wrapper, model):
        return {"torch_fsdp": True}
    between = []  # per step: per layer, at its forward pre-hook: [held bytes, layers materialised]
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(
            lambda module, args, i=i: between[-1].append(
                [i, held_bytes(wrapper, model, grads=False), materialised_layers(layers, names)]))
    shards = [p for p in wrapper.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(shards, lr=LR)
    record = {"shard_numel": sum(p.numel() for p in shards), "shard_dtypes": sorted({str(p.dtype) for p in shards}),
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

    warnings.simplefilter("ignore")
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
    return observation(salt, cases(salt), lambda case: run_on_ranks(
        student_rank, case["world_size"], fn, case, timeout=LAUNCH_TIMEOUT_S))


def reference_rank(rank: int, world_size: int, cls, case: dict) -> dict:
    """The reference's rank: the solution's training, then FSDP2's on the same ranks (one launch, not two)."""
    return {**student_rank(rank, world_size, cls, case), "fsdp2": fsdp2_rank(rank, world_size, case)}


def observe_reference(fn, *, salt: int = 0) -> dict:
    import torch.distributed.fsdp  # noqa: F401  imported once here, not in every forked rank (seconds)

    result = observation(salt, cases(salt), lambda case: run_on_ranks(
        reference_rank, case["world_size"], fn, case, timeout=60))
    result["fsdp2"] = {}
    for name, observed in result["scenarios"].items():
        if "ranks" not in observed:
            raise RuntimeError(f"the reference MiniFSDP failed when {observed['case']['what']}: {observed['error']}")
        result["fsdp2"][name] = [r.pop("fsdp2") for r in observed["ranks"]]
    return result


# ---- reading an observation (plain Python only: no torch from here on) -----------------------

def ranks_of(student: dict, reference: dict, key: str) -> list[dict]:
    ranks = scenario(student, key, what(reference, key))["ranks"]
    if any(r.get("torch_fsdp") for r in ranks):
        raise ScenarioError("Your wrapper uses torch's own FSDP (fully_shard or FullyShardedDataParallel): this "
                            "exercise asks you to write the gathering and reduce-scattering yourself.")
    return ranks


def shard_bytes(c: dict) -> int:
    """What every rank must keep: its fp32 shard of each flat, padded layer."""
    return sum(4 * math.ceil(n / c["world_size"]) for n in layer_numels(c))


def full_layer_bytes(c: dict, layer: int) -> int:
    itemsize = 2 if c["param_dtype"] else 4
    return itemsize * math.ceil(layer_numels(c)[layer] / c["world_size"]) * c["world_size"]


def matches_fsdp2(student, reference, key: str, rtol: float) -> str | None:
    c, want = case(reference, key), reference["fsdp2"][key]
    for rank, (got, ref) in enumerate(zip(ranks_of(student, reference, key), want)):
        for step in range(c["steps"]):
            if not close(got["losses"][step:step + 1], ref["losses"][step:step + 1], atol=1e-7, rtol=rtol):
                return (f"When {c['what']}, rank {rank}'s loss at step {step + 1} differs from FSDP2's: "
                        + ("gather every layer's full parameters before it runs (in the right order, without the "
                           "padding)." if step == 0 else "the update of the step before was wrong."))
            got_norm, ref_norm = got["grad_norms"][step], ref["grad_norms"][step]
            if not close([got_norm], [ref_norm], atol=1e-7, rtol=rtol):
                n = c["world_size"]
                if ref_norm and abs(got_norm / ref_norm - n) < 0.05 * n:
                    return (f"When {c['what']}, the gradient norm at step {step + 1} is {n}× FSDP2's: "
                            "reduce-scatter sums, so divide by the world size.")
                return (f"When {c['what']}, the gradient norm at step {step + 1} differs from FSDP2's: each shard's "
                        ".grad must hold the average over ranks of that shard of the full gradient.")
    return None


def check_fp32_two(student, reference):
    return matches_fsdp2(student, reference, "fp32_two", FP32_RTOL)


def check_fp32_three(student, reference):
    problem = matches_fsdp2(student, reference, "fp32_three", FP32_RTOL)
    if problem:
        return problem
    return check_full_params(student, reference, "fp32_three", PARAM_ATOL)


def check_full_params(student, reference, key: str = "fp32_two", atol: float = PARAM_ATOL):
    c, want = case(reference, key), reference["fsdp2"][key][0]["full_params"]
    trained_apart = matches_fsdp2(student, reference, key, FP32_RTOL if key.startswith("fp32") else BF16_RTOL)
    for rank, got in enumerate(ranks_of(student, reference, key)):
        full = got["full_params"]
        if sorted(full) != sorted(want):
            return (f"When {c['what']}, gather_full_params() on rank {rank} does not return the model's state dict "
                    "names (e.g. '0.weight') with one full tensor each.")
        for name, (dtype, values) in full.items():
            if dtype != "torch.float32":
                return f"gather_full_params() returned {name} as {dtype}: return float32 tensors."
            if not close(values, want[name], atol=atol):
                if trained_apart:  # the training itself went wrong: say that, not "unpad"
                    return (f"When {c['what']}, the parameters after {c['steps']} steps differ from FSDP2's because "
                            "the training did (see the loss and gradient-norm checks).")
                return (f"When {c['what']}, rank {rank}'s {name} from gather_full_params() after {c['steps']} steps "
                        "differs from FSDP2's trained parameter: unpad and reshape every layer's gathered shards.")
    return None


def check_bf16(student, reference):
    return matches_fsdp2(student, reference, "bf16_two", BF16_RTOL)


def check_fp32_master(student, reference):
    ranks = ranks_of(student, reference, "bf16_two")
    if any(r["shard_dtypes"] != ["torch.float32"] for r in ranks):
        return ("With param_dtype=torch.bfloat16 your optimizer's parameters (the shards) are not float32: keep "
                "float32 master shards and cast a copy to param_dtype just before the all-gather.")
    return check_full_params(student, reference, "bf16_two", PARAM_ATOL)


def check_keeps_shard(student, reference):
    c = case(reference, "fp32_two")
    budget = shard_bytes(c) + SLACK_BYTES
    for rank, r in enumerate(ranks_of(student, reference, "fp32_two")):
        if r["shard_numel"] * 4 > budget:
            return (f"Rank {rank}'s trainable parameters are larger than one shard per layer: after __init__ keep "
                    "only this rank's slice of each flat, padded layer (drop the full parameters).")
        for step, held in enumerate(r["after_step"]):
            if held > budget:
                return (f"Between steps rank {rank} still holds more than its shards (step {step + 1}): keep only "
                        "this rank's slice of each flat, padded layer, and drop the gathered tensors.")
    return None


def check_frees_layers(student, reference):
    for key in ("fp32_two", "bf16_two"):
        c = case(reference, key)
        extra = shard_bytes(c) // 2 + SLACK_BYTES  # room for a param_dtype copy of the shards
        n_layers = len(layer_numels(c))
        for rank, r in enumerate(ranks_of(student, reference, key)):
            for step, hooks in enumerate(r["between"]):
                if sorted(h[0] for h in hooks) != list(range(n_layers)):
                    return ("The grader's hooks did not see each layer run once per forward: call every child "
                            "module of the Sequential, in order, with its gathered parameters set on it.")
                for layer, held, materialised in hooks:
                    where = f"When {c['what']}, rank {rank}, step {step + 1}, just before layer {layer + 1} ran"
                    if layer not in materialised:
                        return f"{where}, its full parameters were not set on it: gather them before it runs."
                    if len(materialised) > 1 or held > shard_bytes(c) + full_layer_bytes(c, layer) + extra:
                        return (f"{where}, the parameters of more than one layer were materialised: free each "
                                "layer's gathered parameters right after its forward.")
    return None


def check_grad_shards(student, reference):
    c = case(reference, "fp32_two")
    budget = 2 * shard_bytes(c) + shard_bytes(c) // 2 + SLACK_BYTES
    for rank, r in enumerate(ranks_of(student, reference, "fp32_two")):
        for step, held in enumerate(r["after_sync"]):
            if held > budget:
                return (f"After finish_gradient_synchronization() at step {step + 1}, rank {rank} still holds "
                        "full-size gradients: reduce-scatter so that each rank keeps only its shard's gradient, and "
                        "drop the full ones.")
    return None


def trained_for_real(got: dict, want: dict) -> str | None:
    """The evidence: every rank's first loss is FSDP2's on the seeded problem (only a forward through the
    gathered parameters gives it) and its first gradient norm is non-zero (gradients reached the shards)."""
    ranks = got.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != len(want["ranks"]):
        return f"when {want['case']['what']}, the grader got no result from every rank."
    for r, w in zip(ranks, want["ranks"]):
        if r.get("torch_fsdp") or not close(r["losses"][:1], w["losses"][:1], atol=1e-7, rtol=BF16_RTOL) \
                or not r["grad_norms"][0] > 0:
            return f"when {want['case']['what']}, your wrapper did not train the grader's model."
    return None


EXERCISE = Exercise(
    name="MiniFSDP",
    notebook="05_fsdp_zero.ipynb",
    observe=observe,
    observe_reference=observe_reference,
    evidence=trained_for_real,
    timeout_s=90,  # three launches; a deadlocking submission spends LAUNCH_TIMEOUT_S in each
    checks=[
        Check("Losses and gradient norms match FSDP2 step by step (float32, 2 ranks)", 3, check_fp32_two),
        Check("Matches FSDP2 on 3 ranks, with layer sizes not divisible by 3 (padding)", 2, check_fp32_three),
        Check("gather_full_params() returns FSDP2's trained float32 parameters", 1, check_full_params),
        Check("With param_dtype=bfloat16, losses and gradient norms match FSDP2 within tolerance", 1, check_bf16),
        Check("With param_dtype=bfloat16, the master weights stay float32", 1, check_fp32_master),
        Check("Each rank keeps only its shard of every layer between steps", 1, check_keeps_shard,
              evidence=("fp32_two",)),
        Check("Frees each layer's gathered parameters after its forward (memory between layers)", 2,
              check_frees_layers, evidence=("fp32_two", "bf16_two")),
        Check("Keeps only the gradient shard after synchronisation (reduce-scatter, not all-reduce)", 1,
              check_grad_shards, evidence=("fp32_two",)),
    ],
)
