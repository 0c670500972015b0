"""GPU evidence one GPU can give: Lesson 1 (accumulation: memory and time vs micro-batch), Lesson 2 (mixed
precision), Lesson 6 (model FLOPs utilisation of a training step) and Lesson 7 (fused attention against naive
attention; bfloat16 and FP8 matrix-product throughput)."""
import torch
from torch import nn

from coursekit.amp_bench import DTYPES, GPU_SHAPE, TinyTransformerBlock, amp_rows, matmul_ms
from coursekit.dist import my_device
from coursekit.flops import step_mfu
from coursekit.fp8 import fp8_matmul_ms, fp8_supported
from coursekit.memory import profile_memory
from coursekit.timing import time_call
from coursekit.transformer import naive_attention

from .evidence_common import Plan, mib


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
                     "peak above the resting state during one accumulation window, median of the window times",
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
                     "float16 uses a GradScaler; held after forward = what the forward pass keeps for the "
                     "backward (activations and autocast's 16-bit weight copies)",
            "notes": "time and memory ratios are relative to float32 on the same device (TF32 off, PyTorch's "
                     "default for matrix products)"}


def _mfu_rows(rank, world_size, shape, matmul_n, repeat):
    device = my_device()
    rows = []
    for dtype in DTYPES.values():
        row = step_mfu(dtype, device, repeat=repeat, **shape)
        matmul_s = matmul_ms(matmul_n, dtype, device, repeat=repeat) / 1e3
        row[f"matmul {matmul_n}² TFLOP/s"] = 2 * matmul_n**3 / matmul_s / 1e12
        row["step vs matmul rate"] = row["model TFLOP/s"] / row[f"matmul {matmul_n}² TFLOP/s"]
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the next dtype's activations start from a clean cache
    return rows


def lesson6_mfu(plan: Plan) -> dict:
    shape = plan.size({"depth": 8, "batch": 8, "seq": 1024, "width": 2048, "heads": 16},
                      {"depth": 2, "batch": 2, "seq": 8, "width": 32, "heads": 4})
    matmul_n = plan.size(8192, 64)
    rows = plan.run(_mfu_rows, 1, shape, matmul_n, plan.size(3, 1))[0]
    return {"rows": rows,
            "setup": f"one training step (autocast, SGD; coursekit.flops.step_mfu) of {shape['depth']} transformer "
                     f"blocks of width {shape['width']}, {shape['batch']} sequences of {shape['seq']} tokens; "
                     "model FLOPs = tokens × (6 × params + 12 × layers × seq × width)",
            "notes": "MFU = model FLOP/s ÷ the datasheet's dense 16-bit peak (none for float32: its rate depends on "
                     "TF32); 'step vs matmul rate' compares with one large matrix product measured on the same GPU"}


def _attention_rows(rank, world_size, lengths, heads, head_dim, repeat):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device = my_device()
    dtype = torch.bfloat16
    kinds = {"naive (s × s matrices)": lambda q, k, v: naive_attention(q, k, v, is_causal=True),
             "SDPA, math backend": lambda q, k, v: _sdpa_with(sdpa_kernel(SDPBackend.MATH), q, k, v),
             "SDPA, default (fused) backend": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
                 q, k, v, is_causal=True)}
    rows = []
    for s in lengths:
        q, k, v = (torch.randn(1, heads, s, head_dim, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        upstream = torch.randn(1, heads, s, head_dim, device=device, dtype=dtype)
        for name, attend in kinds.items():
            def step():
                attend(q, k, v).backward(upstream)
                q.grad = k.grad = v.grad = None  # at the end: the CPU profiler sees the step free what it made

            step()  # warm-up (kernel selection, cuBLAS workspaces)
            peak, _ = profile_memory(step, device)
            seconds = time_call(step, repeat=repeat, warmup=0, device=device)
            flops = 3.5 * 2 * 2 * heads * s * s * head_dim / 2  # causal: half of q kᵀ and P v; backward ≈ 2.5×
            rows.append({"seq": s, "attention": name, "fwd+bwd ms": seconds * 1e3, "peak MiB": mib(peak),
                         "TFLOP/s (causal, ≈)": flops / seconds / 1e12})
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def _sdpa_with(context, q, k, v):
    with context:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def lesson7_attention(plan: Plan) -> dict:
    lengths = plan.size([1024, 2048, 4096, 8192], [16, 32])
    heads, head_dim = plan.size(16, 2), plan.size(64, 8)
    rows = plan.run(_attention_rows, 1, lengths, heads, head_dim, plan.size(5, 1))[0]
    return {"rows": rows,
            "setup": f"one sequence, {heads} heads of {head_dim}, bfloat16, causal; forward + backward of attention "
                     "alone; peak = bytes allocated above the resting state (CUDA's counters); "
                     "naive = coursekit.transformer.naive_attention under autograd",
            "notes": "The fused backend's memory grows like s and its time like s², without the s × s matrices' "
                     "traffic to HBM; the naive and math rows keep them (Lesson 7, sections 2-4)."}


def _matmul_rows(rank, world_size, n, repeat):
    device = my_device()
    rows = []
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        seconds = matmul_ms(n, dtype, device, repeat=repeat) / 1e3
        rows.append({"dtype": name, "n": n, "ms": seconds * 1e3, "TFLOP/s": 2 * n**3 / seconds / 1e12})
    if fp8_supported(device):
        seconds = fp8_matmul_ms(n, device, repeat=repeat) / 1e3
        rows.append({"dtype": "float8_e4m3fn (scaled, bf16 out)", "n": n, "ms": seconds * 1e3,
                     "TFLOP/s": 2 * n**3 / seconds / 1e12})
    else:
        rows.append({"dtype": "float8_e4m3fn", "n": n, "ms": None, "TFLOP/s": None})
    base = rows[1]["TFLOP/s"]
    for row in rows:
        row["vs bfloat16"] = row["TFLOP/s"] / base if row["TFLOP/s"] else None
    return rows


def lesson7_matmul(plan: Plan) -> dict:
    n = plan.size(8192, 64)
    rows = plan.run(_matmul_rows, 1, n, plan.size(10, 1))[0]
    return {"rows": rows,
            "setup": f"one {n}×{n} @ {n}×{n} product per dtype, median time; FP8 = coursekit.fp8.scaled_matmul "
                     "(F.scaled_mm; torch._scaled_mm before torch 2.13) of E4M3 operands with per-tensor float32 "
                     "scales, bfloat16 result",
            "notes": "float32 runs without TF32 (PyTorch's default for matrix products). FP8 needs compute "
                     "capability 8.9 or newer; on older GPUs its row is empty."}
