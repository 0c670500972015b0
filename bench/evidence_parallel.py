"""GPU evidence across GPUs: all-reduce bandwidth and DDP scaling (Lesson 3), FSDP2 memory (Lesson 5) and the
communication share of a DDP step read from the profiler (Lesson 6).

Each runs the lesson's own code from coursekit at GPU sizes. Lessons 3 and 5 need two GPUs or more (the recorder
says so instead of recording them); Lesson 6's profile also means something on one GPU: a single rank has
nothing to communicate, and its step splits into compute and GPU idle.
"""
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from coursekit.allreduce_timing import allreduce_seconds, bus_bandwidth
from coursekit.amp_bench import TinyTransformerBlock
from coursekit.ddp_profile import profile_ddp, slowest_rank
from coursekit.dist import barrier, my_device
from coursekit.profiling import PARTS, shares
from coursekit.sharding import SETUPS, deep_mlp, measure_sharding
from coursekit.timing import sync

from .evidence_common import Plan, mib

# ---- Lesson 3: all-reduce bus bandwidth ----------------------------------------------------------------


def lesson3_allreduce(plan: Plan) -> dict:
    elements = plan.size([4**k * 256 for k in range(11)], [256, 4096, 65536])  # float32: 1 KiB … 1 GiB
    repeats = plan.size(15, 3)
    rows = []
    for n in plan.world_sizes(smallest=2):
        per_rank = plan.run(allreduce_seconds, n, elements, repeats)
        for i, count in enumerate(elements):
            t = max(r[i] for r in per_rank)  # the slowest rank finishes the collective
            rows.append({"ranks": n, "bytes": 4 * count, "time us": t * 1e6, "algbw GB/s": 4 * count / t / 1e9,
                         "busbw GB/s": bus_bandwidth(4 * count, t, n) / 1e9})
    return {"rows": rows,
            "setup": f"coursekit.allreduce_timing.allreduce_seconds (Lesson 3's): float32 buffers, fastest of "
                     f"{repeats} calls, each timed from a barrier with the host clock (launch and sync included); "
                     "slowest rank",
            "notes": "busbw = algbw × 2(N-1)/N, the bytes each rank's links carry in a ring all-reduce, per second"}


# ---- Lesson 3: DDP scaling --------------------------------------------------------------------------------

def transformer(width: int, heads: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[TinyTransformerBlock(width, heads) for _ in range(depth)])


def _ddp_step_seconds(rank, world_size, cfg):
    device = my_device()
    model = DDP(transformer(cfg["width"], cfg["heads"], cfg["depth"]).to(device),
                device_ids=[device.index] if device.type == "cuda" else None)
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
    for n in plan.world_sizes():  # 1 rank included: the same backend and device as the others
        step = max(plan.run(_ddp_step_seconds, n, cfg))
        rows.append({"ranks": n, "step ms": step * 1e3, "samples/s": n * cfg["batch"] / step})
    for row in rows:
        row["per-rank samples/s"] = row["samples/s"] / row["ranks"]
        row["scaling efficiency"] = row["samples/s"] / (row["ranks"] * rows[0]["samples/s"])
    params = sum(p.numel() for p in transformer(cfg["width"], cfg["heads"], cfg["depth"]).parameters())
    return {"rows": rows,
            "notes": "weak scaling: the batch per rank is fixed, so perfect scaling is efficiency 1.0",
            "setup": f"DDP, {cfg['depth']} transformer blocks (width {cfg['width']}, {params / 1e6:.1f} M params), "
                     f"batch {cfg['batch']} x seq {cfg['seq']} per rank, "
                     + (f"{str(cfg['dtype']).removeprefix('torch.')} autocast" if cfg["dtype"] else "fp32")
                     + f", SGD, mean of {cfg['steps']} steps, slowest rank"}


# ---- Lesson 5: DDP, ZeRO-1 and FSDP2 per rank ------------------------------------------------------------

def lesson5_fsdp_zero(plan: Plan) -> dict:
    shape = plan.size({"width": 4096, "hidden_layers": 8, "batch": 1024}, {"width": 64, "hidden_layers": 2, "batch": 8})
    psi = sum(p.numel() for p in deep_mlp(shape["width"], shape["hidden_layers"]).parameters())
    rows = []
    for n in plan.world_sizes(smallest=2):
        per_rank = plan.run(measure_sharding, n, SETUPS, shape)
        # fp32 Adam, 4 + 4 + 8 bytes per parameter: ZeRO-1 shards the 8, FSDP2 (ZeRO-3) all 16 between steps
        formula = {"DDP": 16 * psi, "ZeRO-1": 8 * psi + 8 * psi / n, "FSDP2 (no reshard)": 16 * psi / n,
                   "FSDP2": 16 * psi / n}
        for setup in SETUPS:
            held = max(sum(r[setup][b] for b in ("weights", "gradients", "optimizer")) for r in per_rank)
            rows.append({"setup": setup, "ranks": n, "state MiB (measured)": mib(held),
                         "state MiB (ZeRO formula)": mib(formula[setup]),
                         "peak extra MiB": mib(max(r[setup]["peak"] for r in per_rank))})
    return {"rows": rows,
            "notes": "state = weights + gradients + Adam moments held by one rank (the largest over ranks); "
                     "peak extra = above that state, during one step",
            "setup": f"coursekit.sharding.measure_sharding (Lesson 5's): MLP with {shape['hidden_layers']} hidden "
                     f"Linear({shape['width']}, {shape['width']}) layers, {psi / 1e6:.1f} M params, fp32 Adam, "
                     f"batch {shape['batch']} per rank"}


# ---- Lesson 6: communication share of a DDP step, from the profiler ----------------------------------------

def lesson6_comm_share(plan: Plan) -> dict:
    widths = plan.size([1024, 4096, 8192], [32, 64])
    batch = plan.size(1024, 8)
    configs = [{"width": w, "bucket_mb": 25.0, "batch": batch} for w in widths]
    configs += [{"width": widths[-1], "bucket_mb": mb, "batch": batch} for mb in plan.size((1.0, 100.0), (0.01,))]
    rows = []
    for n in sorted({1, plan.ranks}):  # every n on the same backend and device
        for r in slowest_rank(plan.run(profile_ddp, n, configs)):
            s = shares(r)
            rows.append({"ranks": n, "width": r["width"], "params M": r["params"] / 1e6, "bucket MB": r["bucket_mb"],
                         "buckets": r["buckets"], "step ms": r["step ms"],
                         **{f"{p} %": 100 * s[p] for p in PARTS}, "straggler ms": r["straggler ms"]})
    notes = ("shares of the step from coursekit.profiling: on a GPU the device's own work (NCCL kernels = "
             "communication, other kernels and copies = compute, annotations ignored); slowest rank shown")
    if plan.ranks == 1:
        notes = ("single-rank profiles (one GPU): nothing to communicate, so the step is compute and GPU idle "
                 "(launch gaps, Python between ops); the communication share needs ≥ 2 GPUs. " + notes)
    return {"rows": rows, "notes": notes,
            "setup": f"coursekit.ddp_profile.profile_ddp (Lesson 6's): DDP over an MLP 64 → width ×4 → 10, batch "
                     f"{batch} per rank, fp32, median of 6 profiled steps"}

