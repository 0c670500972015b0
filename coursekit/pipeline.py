"""Lesson 4's pipeline executor, shared with the GPU evidence recorder: one rank runs its stage's operations.

``run_stage`` follows one stage's row of a schedule (``gpipe_order`` or ``one_f_one_b_order``): a forward
receives its input from the previous stage, computes and sends its output on; a backward receives the output
gradient, runs ``backward`` and sends the input gradient back. Every compute is timestamped, so afterwards we
know when each stage was busy and when it waited; ``stage_bubble`` reads the schedule's own waits from that.
"""
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from .timing import sync


def make_stage(stage: int, width: int, layers: int) -> nn.Module:
    """One pipeline stage: ``layers`` × (Linear(width, width) + Tanh), seeded by its position."""
    torch.manual_seed(100 + stage)
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*blocks)


def gpipe_order(num_stages: int, stage: int, m: int) -> list[tuple[str, int]]:
    """GPipe: every forward, then every backward."""
    return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]


def one_f_one_b_order(num_stages: int, stage: int, m: int) -> list[tuple[str, int]]:
    """1F1B: (p - 1 - stage) warm-up forwards, then alternate one forward, one backward; drain the backwards."""
    warmup = min(num_stages - 1 - stage, m)
    order, f = [("F", j) for j in range(warmup)], warmup
    for b in range(m):
        if f < m:
            order.append(("F", f))
            f += 1
        order.append(("B", b))
    return order


def run_stage(rank, num_stages, order, module, x_batch, y_batch, dev):
    """Run this rank's operations in `order`; return [(kind, j, start, end, bytes allocated on a GPU)].

    Every stage maps width → width, so a received activation or gradient has a micro-batch's shape.
    """
    m = len(order) // 2
    x_mbs, y_mbs = x_batch.chunk(m), y_batch.chunk(m)
    inputs, outputs, log, pending = {}, {}, [], None
    on_gpu = dev.type == "cuda"

    def send(tensor, dst):
        nonlocal pending
        if pending is not None:
            pending.wait()  # at most one send in flight: bounded buffers, as in a real pipeline
        pending = dist.isend(tensor.contiguous(), dst)

    for kind, j in order:
        with record_function(f"op {kind}{j}"):  # a mark in the profile: memory is read at its end
            if kind == "F":
                if rank == 0:
                    x = x_mbs[j].detach()
                else:
                    x = torch.empty_like(x_mbs[j])
                    dist.recv(x, rank - 1)
                x.requires_grad_(True)  # on stage 0 too, so that both stages do the same work
            else:
                grad = None
                if rank < num_stages - 1:
                    grad = torch.empty_like(outputs[j])
                    dist.recv(grad, rank + 1)
            # Under NCCL, recv returns before the data is there (the GPU waits for it): wait here, or the
            # time spent waiting for the other stage would be counted as this stage's compute.
            sync(dev)
            start = time.perf_counter()
            if kind == "F":
                out = module(x)
                if rank == num_stages - 1:
                    out = nn.functional.mse_loss(out, y_mbs[j]) / m  # mean over micro-batches, as in accumulation
            else:
                outputs[j].backward(grad)
                del grad
            sync(dev)
            end = time.perf_counter()
            if kind == "F":
                inputs[j], outputs[j] = x, out
                if rank < num_stages - 1:
                    send(out.detach(), rank + 1)
            else:
                if rank > 0:
                    send(inputs[j].grad, rank - 1)
                del inputs[j], outputs[j]  # this micro-batch's activations are no longer needed
            log.append((kind, j, start, end, torch.cuda.memory_allocated(dev) if on_gpu else None))
    if pending is not None:
        pending.wait()
    return log


def stage_bubble(log, start: float, end: float) -> tuple[float, float]:
    """(busy, bubble) seconds of one stage in a step from ``start`` to ``end`` (all stages' first and last op).

    The bubble is the waits the schedule imposes: before the first operation (fill), between the last forward
    and the first backward (turnaround), after the last operation (drain). Every other wait is a stall. (GPipe's
    "flush" is the whole end-of-batch drain that makes these waits; Lesson 4 explains both words.)
    """
    busy = sum(e - s for _, _, s, e, _ in log)
    last_forward = max(i for i, op in enumerate(log) if op[0] == "F")
    turnaround = log[last_forward + 1][2] - log[last_forward][3] if last_forward + 1 < len(log) else 0.0
    return busy, (log[0][2] - start) + turnaround + (end - log[-1][3])
