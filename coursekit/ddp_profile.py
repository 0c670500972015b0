"""Lesson 6's profiled DDP steps, shared with the GPU evidence recorder.

``profile_ddp`` runs on every rank: for each configuration (MLP width, DDP bucket size, batch per rank) it
trains a few steps, profiles six more, each inside ``record_function("train_step")``, and reduces the profile
to the four parts of every step (``coursekit.profiling.step_breakdown``). ``slowest_rank`` then keeps, per
configuration, the rank that computed longest: its communication time is the collective itself, not a wait
for a late partner.
"""
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

from .dist import my_device
from .profiling import is_communication, median_breakdown, ops_table, step_breakdown, step_intervals
from .timing import sync, time_call


def make_mlp(width: int, depth: int = 4) -> nn.Module:
    """64 → width, (depth - 1) × Linear(width, width), → 10, with ReLUs between."""
    torch.manual_seed(0)
    layers = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def profile_ddp(rank, world_size, configs, trace_dir=None, steps=6):
    """Per configuration ({"width", "bucket_mb", "batch"}, optionally "trace": True): the breakdown of each step."""
    dev = my_device()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    results = []
    for cfg in configs:
        model = DDP(make_mlp(cfg["width"]).to(dev), bucket_cap_mb=cfg["bucket_mb"],
                    device_ids=[dev.index] if dev.type == "cuda" else None)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        torch.manual_seed(rank)  # each rank its own data
        x, y = torch.randn(cfg["batch"], 64, device=dev), torch.randint(0, 10, (cfg["batch"],), device=dev)

        def step():
            with record_function("train_step"):
                optimizer.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(model(x), y).backward()  # DDP all-reduces during backward
                optimizer.step()
                sync(dev)  # the step ends when the device has finished it

        for _ in range(3):
            step()
        with profile(activities=activities) as prof:
            for _ in range(steps):
                step()
        params = sum(p.numel() for p in model.parameters())
        flat = torch.zeros(params, device=dev)  # the same bytes, all-reduced alone: what the cost model calls T_comm
        alone = time_call(lambda: dist.all_reduce(flat), repeat=5, warmup=1, device=dev)
        buckets = model._get_ddp_logging_data().get("rebuilt_bucket_sizes", "")
        result = {**cfg, "params": params, "buckets": len(str(buckets).split(",")), "allreduce alone ms": alone * 1e3,
                  "steps": step_breakdown(prof)}
        if cfg.get("trace") and trace_dir:
            prof.export_chrome_trace(str(Path(trace_dir) / f"ddp_step_rank{rank}.json"))
            result["timeline"] = step_intervals(prof)[-1]
            result["table"] = ops_table(prof, rows=10, on_device=dev.type == "cuda")
            result["comm rows"] = {e.key: (e.count, e.cpu_time_total / 1e3) for e in prof.key_averages()
                                   if is_communication(e.key)}
        results.append(result)
        model = optimizer = flat = None  # free this setup's memory before the next one
    return results


def computing(parts: dict) -> float:
    return parts["compute only"] + parts["overlapped"]


def slowest_rank(per_rank: list[list[dict]]) -> list[dict]:
    """For each configuration: the median step of the rank that computed longest, and how much longer it took."""
    rows = []
    for i, cfg_result in enumerate(per_rank[0]):
        medians = [median_breakdown(ranks[i]["steps"]) for ranks in per_rank]
        slowest = max(medians, key=computing)
        row = {k: v for k, v in cfg_result.items() if k != "steps"}
        row.update(slowest)
        row["straggler ms"] = computing(slowest) - min(computing(m) for m in medians)
        row["allreduce alone ms"] = max(ranks[i]["allreduce alone ms"] for ranks in per_rank)
        rows.append(row)
    return rows
