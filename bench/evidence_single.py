"""GPU evidence from one device: Lesson 1 (accumulation: memory vs micro-batch) and Lesson 2 (mixed precision)."""
import torch
from torch import nn

from coursekit.amp_bench import GPU_SHAPE, TinyTransformerBlock, amp_rows
from coursekit.memory import profile_memory
from coursekit.timing import time_call

from .evidence_common import Plan, mib, my_device


def _accumulation_rows(rank, world_size, shape, effective_batch, micro_batches, repeat):
    device = my_device()
    torch.manual_seed(0)
    model = TinyTransformerBlock(shape["width"], shape["heads"]).to(device)
    x = torch.randn(effective_batch, shape["seq"], shape["width"], device=device)
    target = torch.randn_like(x)

    def window(b):  # one optimizer step's worth of micro-batches (Lesson 1's one_window)
        k = effective_batch // b
        for xb, tb in zip(x.split(b), target.split(b)):
            (nn.functional.mse_loss(model(xb), tb) / k).backward()
        model.zero_grad(set_to_none=True)

    rows = []
    for b in micro_batches:
        window(b)  # warm-up: one-off allocations
        peak, _ = profile_memory(lambda: window(b), device)
        seconds = time_call(lambda: window(b), repeat=repeat, warmup=0, device=device)
        rows.append({"micro-batch": b, "k": effective_batch // b, "peak MiB": mib(peak),
                     "window ms": seconds * 1e3, "samples/s": effective_batch / seconds})
    return rows


def lesson1_accumulation(plan: Plan) -> dict:
    shape = plan.size({k: GPU_SHAPE[k] for k in ("seq", "width", "heads")}, {"seq": 8, "width": 32, "heads": 4})
    effective = plan.size(64, 8)
    micro = plan.size([4, 8, 16, 32, 64], [2, 8])
    rows = plan.run(_accumulation_rows, 1, shape, effective, micro, plan.size(5, 1))[0]
    return {"rows": rows,
            "setup": f"one pre-norm transformer block {shape}, fp32, effective batch {effective}, "
                     "peak above the resting state during one accumulation window",
            "notes": "Memory falls with the micro-batch (activations), time per window rises as micro-batches "
                     "get too small to fill the GPU: the trade Lesson 1 measures on the CPU."}


def _amp_rows(rank, world_size, shape, matmul_n, repeat):
    return amp_rows(my_device(), matmul_n=matmul_n, repeat=repeat, **shape)


def lesson2_amp(plan: Plan) -> dict:
    shape = plan.size(GPU_SHAPE, {"batch": 2, "seq": 8, "width": 32, "heads": 4})
    matmul_n = plan.size(4096, 64)
    rows = plan.run(_amp_rows, 1, shape, matmul_n, plan.size(5, 1))[0]
    return {"rows": rows,
            "setup": f"coursekit.amp_bench.amp_rows on one device, shape {shape}, matmul {matmul_n}²; "
                     "float16 uses a GradScaler",
            "notes": "time and memory ratios are relative to float32 on the same device"}
