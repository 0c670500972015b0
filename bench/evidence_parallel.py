"""GPU evidence across GPUs: all-reduce bandwidth and DDP scaling (Lesson 3), FSDP2 memory (Lesson 5) and the
communication share of a DDP step read from the profiler (Lesson 6).

With one GPU there is nothing to communicate with: each section records what one rank can show and says so.
"""
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function

from coursekit.amp_bench import TinyTransformerBlock
from coursekit.memory import profile_memory
from coursekit.profiling import median_breakdown, shares, step_breakdown

from .evidence_common import Plan, barrier, mib, my_device, sync

ONE_GPU = "Only one GPU was visible: "


def transformer(width: int, heads: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[TinyTransformerBlock(width, heads) for _ in range(depth)])


def _wrap_ddp(model, device, **kwargs):
    return DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None, **kwargs)


# ---- Lesson 3: all-reduce bus bandwidth ----------------------------------------------------------------

def _allreduce_seconds(rank, world_size, sizes, iterations):
    """Seconds per all-reduce of each size: ``iterations`` back to back, averaged (as nccl-tests does)."""
    device, seconds = my_device(), []
    for n_bytes in sizes:
        buffer = torch.ones(n_bytes // 4, device=device)
        for _ in range(3):
            dist.all_reduce(buffer)  # warm-up: connections, buffers
        sync(device)
        barrier(device)
        start = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
        wall = time.perf_counter()
        if start:
            start.record()
        for _ in range(iterations):
            dist.all_reduce(buffer)
        if start:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3 / iterations)
        else:
            seconds.append((time.perf_counter() - wall) / iterations)
    return seconds


def lesson3_allreduce(plan: Plan) -> dict:
    sizes = plan.size([4**k * 1024 for k in range(11)], [1024, 16384, 262144])  # 1 KiB … 1 GiB
    iterations = plan.size(20, 3)
    worlds = [n for n in plan.world_sizes() if n >= 2] or [1]
    rows = []
    for n in worlds:
        per_rank = plan.run(_allreduce_seconds, n, sizes, iterations)
        for i, n_bytes in enumerate(sizes):
            t = max(r[i] for r in per_rank)  # the slowest rank finishes the collective
            algbw = n_bytes / t / 1e9
            rows.append({"ranks": n, "bytes": n_bytes, "time us": t * 1e6, "algbw GB/s": algbw,
                         "busbw GB/s": algbw * 2 * (n - 1) / n})
    notes = "busbw = algbw * 2(N-1)/N, the bytes each rank's links carry in a ring all-reduce, per second"
    if worlds == [1]:
        notes = (ONE_GPU + "an all-reduce over 1 rank moves no data (2(N-1)/N = 0), so busbw is 0 by definition; "
                 "the times are NCCL's fixed cost per call. Record on 2 or more GPUs for bandwidth.")
    return {"rows": rows, "notes": notes,
            "setup": f"float32 buffers, {iterations} back-to-back all-reduces per size, slowest rank"}


# ---- Lesson 3: DDP scaling --------------------------------------------------------------------------------

def _ddp_step_seconds(rank, world_size, cfg):
    device = my_device()
    model = _wrap_ddp(transformer(cfg["width"], cfg["heads"], cfg["depth"]), device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    torch.manual_seed(rank)  # each rank its own data
    x = torch.randn(cfg["batch"], cfg["seq"], cfg["width"], device=device)
    dtype = cfg["dtype"]

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()  # DDP rebuilds its buckets after the first step
    sync(device)
    barrier(device)
    wall = time.perf_counter()
    for _ in range(cfg["steps"]):
        step()
    sync(device)
    return (time.perf_counter() - wall) / cfg["steps"]


def lesson3_data_parallel(plan: Plan) -> dict:
    cfg = plan.size({"width": 1024, "heads": 16, "depth": 4, "seq": 512, "batch": 8, "steps": 20,
                     "dtype": torch.bfloat16},
                    {"width": 32, "heads": 4, "depth": 2, "seq": 8, "batch": 4, "steps": 2, "dtype": None})
    rows = []
    for n in plan.world_sizes():
        step = max(plan.run(_ddp_step_seconds, n, cfg))
        rows.append({"ranks": n, "step ms": step * 1e3, "samples/s": n * cfg["batch"] / step})
    for row in rows:
        row["per-rank samples/s"] = row["samples/s"] / row["ranks"]
        row["scaling efficiency"] = row["samples/s"] / (row["ranks"] * rows[0]["samples/s"])
    params = sum(p.numel() for p in transformer(cfg["width"], cfg["heads"], cfg["depth"]).parameters())
    notes = "weak scaling: the batch per rank is fixed, so perfect scaling is efficiency 1.0"
    if len(rows) == 1:
        notes = ONE_GPU + "this is the 1-rank baseline only; scaling needs 2 or more GPUs."
    return {"rows": rows, "notes": notes,
            "setup": f"DDP, {cfg['depth']} transformer blocks (width {cfg['width']}, {params / 1e6:.1f} M params), "
                     f"batch {cfg['batch']} x seq {cfg['seq']} per rank, "
                     + (f"{str(cfg['dtype']).removeprefix('torch.')} autocast" if cfg["dtype"] else "fp32")
                     + f", SGD, mean of {cfg['steps']} steps, slowest rank"}


# ---- Lesson 5: FSDP2 vs DDP memory per rank ------------------------------------------------------------

def _deep_mlp(width, layers):
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks)


def _local_bytes(tensor):
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # an FSDP shard (DTensor)
    return tensor.numel() * tensor.element_size()


def _sharding_memory(rank, world_size, cfg):
    device, results = my_device(), {}
    torch.manual_seed(rank)
    x = torch.randn(cfg["batch"], cfg["width"], device=device)
    for setup in ("DDP", "FSDP2"):
        model = _deep_mlp(cfg["width"], cfg["layers"])
        if setup == "DDP":
            model = _wrap_ddp(model, device, gradient_as_bucket_view=True)  # no second copy of the gradients
        else:
            mesh = init_device_mesh(device.type, (world_size,))
            for layer in model:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer.to(device), mesh=mesh)
            fully_shard(model, mesh=mesh)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)

        def step():
            optimizer.zero_grad(set_to_none=False)
            model(x).pow(2).mean().backward()
            optimizer.step()

        for _ in range(3):
            step()  # Adam creates its state lazily; DDP rebuilds buckets
        peak, _ = profile_memory(step, device)
        params = list(model.parameters())
        state = (sum(_local_bytes(p) for p in params) + sum(_local_bytes(p.grad) for p in params)
                 + sum(_local_bytes(s[k]) for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")))
        results[setup] = {"state": state, "peak": peak}
        model = optimizer = params = None  # free this setup's memory before the next one
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def lesson5_fsdp_zero(plan: Plan) -> dict:
    cfg = plan.size({"width": 4096, "layers": 8, "batch": 1024}, {"width": 64, "layers": 2, "batch": 8})
    psi = cfg["layers"] * (cfg["width"] ** 2 + cfg["width"])
    rows = []
    for n in plan.world_sizes():
        per_rank = plan.run(_sharding_memory, n, cfg)
        for setup in ("DDP", "FSDP2"):
            rows.append({"setup": setup, "ranks": n,
                         "state MiB (measured)": mib(max(r[setup]["state"] for r in per_rank)),
                         "state MiB (ZeRO formula)": mib(16 * psi / (n if setup == "FSDP2" else 1)),
                         "peak extra MiB": mib(max(r[setup]["peak"] for r in per_rank))})
    notes = ("state = weights + gradients + Adam moments held by one rank "
             "(fp32: 16 bytes per parameter, /N when sharded)")
    if plan.world_sizes() == [1]:
        notes = ONE_GPU + "FSDP2 over 1 rank shards nothing, so both setups hold 16 bytes per parameter. " + notes
    return {"rows": rows, "notes": notes,
            "setup": f"MLP of {cfg['layers']} Linear({cfg['width']}, {cfg['width']}) layers, {psi / 1e6:.1f} M params, "
                     f"fp32 Adam, batch {cfg['batch']}; peak extra = above the state, during one step"}


# ---- Lesson 6: communication share of a DDP step, from the profiler ----------------------------------------

def _profiled_steps(rank, world_size, configs, cfg):
    device, results = my_device(), []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for width, bucket_mb in configs:
        model = _wrap_ddp(transformer(width, cfg["heads"], cfg["depth"]), device, bucket_cap_mb=bucket_mb)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        torch.manual_seed(rank)
        x = torch.randn(cfg["batch"], cfg["seq"], width, device=device)

        def step():
            with record_function("train_step"):
                optimizer.zero_grad(set_to_none=True)
                model(x).pow(2).mean().backward()
                optimizer.step()
                sync(device)  # the step ends when the GPU is done

        for _ in range(3):
            step()
        with profile(activities=activities) as prof:
            for _ in range(cfg["steps"]):
                step()
        buckets = model._get_ddp_logging_data().get("rebuilt_bucket_sizes") or ""
        breakdown = median_breakdown(step_breakdown(prof))
        results.append({"params": sum(p.numel() for p in model.parameters()), "buckets": len(str(buckets).split(",")),
                        "step ms": breakdown["step ms"], **shares(breakdown)})
        model = optimizer = None  # free this setup's memory before the next one
    return results


def lesson6_comm_share(plan: Plan) -> dict:
    cfg = plan.size({"heads": 16, "depth": 4, "seq": 512, "batch": 8, "steps": 5},
                    {"heads": 4, "depth": 2, "seq": 8, "batch": 4, "steps": 2})
    widths = plan.size([256, 512, 1024], [32, 64])
    configs = [(w, 25.0) for w in widths] + [(widths[-1], mb) for mb in plan.size((1.0, 100.0), (0.01,))]
    rows = []
    for n in sorted({1, plan.ranks}):
        results = plan.run(_profiled_steps, n, configs, cfg)
        for i, (width, bucket_mb) in enumerate(configs):
            worst = max((r[i] for r in results), key=lambda r: r["exposed comm"])  # the rank that waited most
            rows.append({"ranks": n, "width": width, "params M": worst["params"] / 1e6, "bucket MB": bucket_mb,
                         "buckets": worst["buckets"], "step ms": worst["step ms"],
                         **{f"{k} %": 100 * worst[k] for k in ("compute only", "overlapped", "exposed comm", "idle")}})
    notes = ("shares of the step from coursekit.profiling (CUDA kernels: NCCL = communication); the rank with the "
             "most exposed communication is shown")
    if plan.ranks == 1:
        notes = ONE_GPU + "a 1-rank DDP step has nothing to communicate; what remains is compute vs GPU idle. " + notes
    return {"rows": rows, "notes": notes,
            "setup": f"DDP over {cfg['depth']} transformer blocks, batch {cfg['batch']} x seq {cfg['seq']} per rank, "
                     f"fp32, median of {cfg['steps']} profiled steps"}
