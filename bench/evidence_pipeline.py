"""GPU evidence for Lesson 4: the GPipe bubble measured on real GPUs against (p-1)/(m+p-1).

With two or more GPUs, p stages (one per GPU) run the GPipe schedule with NCCL send/recv, every compute
timestamped after a device sync, and each stage's idle time split like the lesson does: the bubble (fill,
flush, drain: what the formula predicts) and stalls (message latency between operations).

With one GPU no pipeline can run. What one GPU can show is the other side of the trade: how the time of one
stage's forward+backward per micro-batch grows as micro-batches shrink, and the 2-stage step time that follows
from it, (m+p-1)(t_F+t_B), labelled as a model from measured stage times.
"""
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from .evidence_common import Plan, barrier, my_device, sync


def _stage(width: int, layers: int, stage: int) -> nn.Module:
    torch.manual_seed(100 + stage)
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*blocks)


def _run_gpipe(rank, p, m, module, x, y, device):
    """All forwards, then all backwards; returns [(kind, start, end)] of this stage's computes."""
    xs, ys = x.chunk(m), y.chunk(m)
    inputs, outputs, log, pending = {}, {}, [], None

    def send(tensor, dst):
        nonlocal pending
        if pending is not None:
            pending.wait()  # at most one send in flight
        pending = dist.isend(tensor.contiguous(), dst)

    for j in range(m):
        if rank == 0:
            a = xs[j].detach()
        else:
            a = torch.empty_like(xs[j])
            dist.recv(a, rank - 1)
        a.requires_grad_(True)
        sync(device)  # the input has arrived
        start = time.perf_counter()
        out = module(a)
        if rank == p - 1:
            out = nn.functional.mse_loss(out, ys[j]) / m
        sync(device)
        log.append(("F", start, time.perf_counter()))
        inputs[j], outputs[j] = a, out
        if rank < p - 1:
            send(out.detach(), rank + 1)
    for j in range(m):
        grad = None
        if rank < p - 1:
            grad = torch.empty_like(outputs[j])
            dist.recv(grad, rank + 1)
        sync(device)
        start = time.perf_counter()
        outputs[j].backward(grad)
        sync(device)
        log.append(("B", start, time.perf_counter()))
        if rank > 0:
            send(inputs[j].grad, rank - 1)
        del inputs[j], outputs[j]
    if pending is not None:
        pending.wait()
    return log


def _gpipe_logs(rank, world_size, cfg, micro_batch_counts, repeats):
    device = my_device()
    module = _stage(cfg["width"], cfg["layers"], rank).to(device)
    torch.manual_seed(0)
    x, y = (torch.randn(cfg["batch"], cfg["width"], device=device) for _ in range(2))
    _run_gpipe(rank, world_size, 4, module, x, y, device)  # warm-up: NCCL's peer connections
    logs = {}
    for _ in range(repeats):
        for m in micro_batch_counts:  # interleaved, so slow moments of the machine spread over all m
            module.zero_grad()
            barrier(device)
            logs.setdefault(m, []).append(_run_gpipe(rank, world_size, m, module, x, y, device))
    return logs


def _bubble_and_stalls(logs):
    """Mean over stages of bubble / (busy + bubble) and stalls / span, and the span, for one step."""
    start, end = min(log[0][1] for log in logs), max(log[-1][2] for log in logs)
    span, bubbles, stalls = end - start, [], []
    for log in logs:
        busy = sum(e - s for _, s, e in log)
        last_forward = max(i for i, op in enumerate(log) if op[0] == "F")
        flush = log[last_forward + 1][1] - log[last_forward][2] if last_forward + 1 < len(log) else 0.0
        bubble = (log[0][1] - start) + flush + (end - log[-1][2])
        bubbles.append(bubble / (busy + bubble))
        stalls.append((span - busy - bubble) / span)
    return statistics.mean(bubbles), statistics.mean(stalls), span


def _stage_seconds(rank, world_size, cfg, micro_batch_counts, repeat):
    """One GPU: forward+backward time of one stage on a micro-batch of batch/m rows, for each m."""
    device = my_device()
    module = _stage(cfg["width"], cfg["layers"], 0).to(device)
    x = torch.randn(cfg["batch"], cfg["width"], device=device)
    result = {}
    for m in micro_batch_counts:
        xb = x[: cfg["batch"] // m]

        def f_and_b():
            module(xb).pow(2).mean().backward()

        f_and_b()
        sync(device)
        start = time.perf_counter()
        for _ in range(repeat):
            f_and_b()
        sync(device)
        result[m] = (time.perf_counter() - start) / repeat
    return result


def lesson4_pipeline_parallel(plan: Plan) -> dict:
    cfg = plan.size({"width": 4096, "layers": 4, "batch": 1024}, {"width": 32, "layers": 2, "batch": 16})
    ms = plan.size([1, 2, 4, 8, 16, 32], [1, 2, 4])
    setup = (f"each stage: {cfg['layers']} x (Linear({cfg['width']}, {cfg['width']}) + Tanh), fp32, "
             f"batch {cfg['batch']} rows cut into m micro-batches")
    if plan.ranks == 1:
        seconds = plan.run(_stage_seconds, 1, cfg, ms, plan.size(10, 1))[0]
        rows = [{"m": m, "micro-batch rows": cfg["batch"] // m, "F+B ms per micro-batch": seconds[m] * 1e3,
                 "bubble (formula, p=2)": 1 / (m + 1), "2-stage step ms (model)": (m + 1) * seconds[m] * 1e3}
                for m in ms]
        return {"rows": rows, "setup": setup,
                "notes": "Only one GPU was visible, so no pipeline ran: these are measured single-stage times and "
                         "the step time they imply for 2 stages, (m+1)(t_F+t_B). The bubble shrinks with m while "
                         "small micro-batches use the GPU less well: the trade Lesson 4 describes."}
    rows = []
    for p in sorted({2, min(plan.ranks, 4)}):
        repeats = plan.size(3, 1)
        per_rank = plan.run(_gpipe_logs, p, cfg, ms, repeats)
        for m in ms:
            runs = [_bubble_and_stalls([per_rank[r][m][i] for r in range(p)]) for i in range(repeats)]
            rows.append({"stages p": p, "m": m, "bubble (formula)": (p - 1) / (m + p - 1),
                         "bubble (measured)": statistics.median(b for b, _, _ in runs),
                         "stalls": statistics.median(s for _, s, _ in runs),
                         "step ms": statistics.median(t for _, _, t in runs) * 1e3})
    return {"rows": rows, "setup": setup + f", median of {plan.size(3, 1)} steps",
            "notes": "bubble = fill + flush + drain waits over (busy + bubble), mean of the stages; stalls = other "
                     "waits (message latency), as a fraction of the step"}
