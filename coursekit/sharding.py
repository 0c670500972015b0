"""Lesson 5's sharding measurement, shared with the GPU evidence recorder: what one rank holds and moves.

For each setup (DDP, ZeRO-1, FSDP2 with and without resharding) ``measure_sharding`` trains a deep MLP for a
few steps on every rank, then reports this rank's *local* bytes of weights, gradients and Adam moments (an
FSDP parameter is a ``DTensor``: ``.to_local()`` is this rank's shard), the peak memory of one more step above
what is held between steps (``coursekit.memory``), and the collectives that step called (``traffic``).
"""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.profiler import ProfilerActivity, profile

from .device import describe_device
from .dist import my_device
from .memory import profile_memory

SETUPS = ["DDP", "ZeRO-1", "FSDP2 (no reshard)", "FSDP2"]


def deep_mlp(width: int, hidden_layers: int, inputs: int = 64, outputs: int = 10) -> nn.Module:
    """inputs → width, ``hidden_layers`` × Linear(width, width), → outputs, with ReLUs between."""
    torch.manual_seed(0)
    layers = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(hidden_layers):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, outputs))


def local_bytes(tensor) -> int:
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor shard: this rank's part
    return tensor.numel() * tensor.element_size()


def wrap(setup: str, model: nn.Module, world_size: int, dev: torch.device):
    """The model and its optimizer, set up for ``setup``."""
    model = model.to(dev)
    if setup in ("DDP", "ZeRO-1"):
        model = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None,
                                                    gradient_as_bucket_view=True)  # no second gradient copy
    else:
        mesh = init_device_mesh(dev.type, (world_size,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh, reshard_after_forward=setup == "FSDP2")
        fully_shard(model, mesh=mesh)
    # foreach=False: Adam updates one tensor at a time, so its temporaries stay one tensor large
    if setup == "ZeRO-1":
        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3,
                                              foreach=False)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)


def traffic(prof, backend: str) -> dict[str, tuple[int, int]]:
    """Calls and payload bytes of each collective in one profiled step (payload = the full, unsharded tensor)."""
    names = {"c10d::_allgather_base_": ("all-gather", 0), "c10d::_reduce_scatter_base_": ("reduce-scatter", 1),
             f"{backend}:all_reduce": ("all-reduce", 0), f"{backend}:broadcast": ("broadcast", 0)}
    found = {}
    for event in prof.events():
        if event.name not in names:
            continue
        kind, which = names[event.name]  # which argument is the full tensor: all-gather (out, in), reduce-scatter (out, in)
        shape = [s for s in event.input_shapes if s][which]
        calls, total = found.get(kind, (0, 0))
        found[kind] = (calls + 1, total + torch.Size(shape).numel() * 4)  # fp32
    if "reduce-scatter" in found:
        found.pop("all-reduce", None)  # gloo runs a reduce-scatter as an all-reduce underneath: count it once
    return found


def measure_sharding(rank, world_size, setups, shape, trace_dir=None):
    """For each setup: this rank's local bytes per buffer, the peak of one step above them, and its traffic.

    ``shape``: {"width", "hidden_layers", "batch"}; with ``trace_dir``, rank 0 also writes FSDP2's trace there.
    """
    dev = my_device()
    torch.manual_seed(rank)  # each rank its own data, as in data parallelism
    x = torch.randn(shape["batch"], 64, device=dev)
    y = torch.randint(0, 10, (shape["batch"],), device=dev)
    results = {}
    for setup in setups:
        model, optimizer = wrap(setup, deep_mlp(shape["width"], shape["hidden_layers"]), world_size, dev)

        def step():
            optimizer.zero_grad(set_to_none=False)
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()

        for _ in range(3):
            step()  # DDP re-buckets after the first step; Adam creates its state lazily
        peak, _ = profile_memory(step, dev)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            step()
        if trace_dir and rank == 0 and setup == "FSDP2":
            prof.export_chrome_trace(os.path.join(trace_dir, "fsdp2_step_rank0.json"))
        states = (optimizer.optim if setup == "ZeRO-1" else optimizer).state.values()
        params = list(model.parameters())
        results[setup] = {
            "weights": sum(local_bytes(p) for p in params),
            "gradients": sum(local_bytes(p.grad) for p in params),
            "optimizer": sum(local_bytes(s[k]) for s in states for k in ("exp_avg", "exp_avg_sq")),
            "peak": peak,
            "traffic": traffic(prof, dist.get_backend()),
            "device": describe_device(dev),
        }
        model = optimizer = params = states = None  # free this setup's memory before the next one
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return results
