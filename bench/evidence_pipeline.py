"""GPU evidence for Lesson 4: the GPipe bubble measured on real GPUs against (p-1)/(m+p-1).

p stages (one per GPU) run Lesson 4's executor (``coursekit.pipeline.run_stage``) with NCCL send/recv, and each
stage's idle time is split like the lesson does: the bubble (fill, flush, drain: what the formula predicts) and
stalls (message latency between operations). A pipeline needs two GPUs or more.
"""
import statistics

import torch

from coursekit.dist import barrier, my_device
from coursekit.pipeline import gpipe_order, make_stage, run_stage, stage_bubble

from .evidence_common import Plan


def _gpipe_logs(rank, world_size, cfg, micro_batch_counts, repeats):
    device = my_device()
    module = make_stage(rank, cfg["width"], cfg["layers"]).to(device)
    torch.manual_seed(0)
    x, y = (torch.randn(cfg["batch"], cfg["width"], device=device) for _ in range(2))
    run_stage(rank, world_size, gpipe_order(world_size, rank, 4), module, x, y, device)  # warm-up: NCCL's peers
    logs = {}
    for _ in range(repeats):
        for m in micro_batch_counts:  # interleaved, so slow moments of the machine spread over all m
            module.zero_grad(set_to_none=False)
            barrier(device)
            logs.setdefault(m, []).append(run_stage(rank, world_size, gpipe_order(world_size, rank, m), module,
                                                    x, y, device))
    return logs


def _bubble_and_stalls(logs):
    """Mean over stages of bubble / (busy + bubble) and stalls / span, and the span, for one step."""
    start, end = min(log[0][2] for log in logs), max(log[-1][3] for log in logs)
    span, bubbles, stalls = end - start, [], []
    for log in logs:
        busy, bubble = stage_bubble(log, start, end)
        bubbles.append(bubble / (busy + bubble))
        stalls.append((span - busy - bubble) / span)
    return statistics.mean(bubbles), statistics.mean(stalls), span


def lesson4_pipeline_parallel(plan: Plan) -> dict:
    cfg = plan.size({"width": 4096, "layers": 4, "batch": 1024}, {"width": 32, "layers": 2, "batch": 16})
    ms = plan.size([1, 2, 4, 8, 16, 32], [1, 2, 4])
    repeats = plan.size(3, 1)
    rows = []
    for p in sorted({2, min(plan.ranks, 4)}):
        per_rank = plan.run(_gpipe_logs, p, cfg, ms, repeats)
        for m in ms:
            runs = [_bubble_and_stalls([per_rank[r][m][i] for r in range(p)]) for i in range(repeats)]
            rows.append({"stages p": p, "m": m, "bubble (formula)": (p - 1) / (m + p - 1),
                         "bubble (measured)": statistics.median(b for b, _, _ in runs),
                         "stalls": statistics.median(s for _, s, _ in runs),
                         "step ms": statistics.median(t for _, _, t in runs) * 1e3})
    return {"rows": rows,
            "setup": f"coursekit.pipeline.run_stage (Lesson 4's), each stage: {cfg['layers']} x (Linear({cfg['width']}, "
                     f"{cfg['width']}) + Tanh), fp32, batch {cfg['batch']} rows cut into m micro-batches, "
                     f"median of {repeats} steps",
            "notes": "bubble = fill + flush + drain waits over (busy + bubble), mean of the stages; stalls = other "
                     "waits (message latency), as a fraction of the step"}
