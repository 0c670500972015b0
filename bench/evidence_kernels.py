"""GPU evidence for Lesson 10: its Triton kernels against PyTorch's, timed on the GPU they are written for.

The kernels are the lesson's own, read from ``solutions/lesson10/10_triton_kernels.ipynb`` (one source of truth:
the cells that define them run here as they run in the notebook). Triton comes with the CUDA builds of torch on
Linux; in a dry run on the CPU its interpreter runs them, which proves the code, not the speed.
"""
import json
import linecache
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from coursekit.dist import my_device
from coursekit.timing import time_call

from .evidence_common import Plan

LESSON = Path(__file__).resolve().parent.parent / "solutions" / "lesson10" / "10_triton_kernels.ipynb"
PREAMBLE = "import math\nimport torch\nimport torch.nn.functional as F\nimport triton\nimport triton.language as tl\n"
DEFINES = ("def rmsnorm_fwd_kernel", "class FusedRMSNorm", "def flash_fwd_kernel", "class TritonFlashAttention")


def lesson_kernels() -> dict:
    """The namespace of the lesson's cells that define its kernels and their autograd Functions."""
    cells = [("".join(c["source"])) for c in json.loads(LESSON.read_text())["cells"] if c["cell_type"] == "code"]
    namespace = {"__name__": "lesson10_kernels"}
    for number, source in enumerate([PREAMBLE, *(s for s in cells if any(d in s for d in DEFINES))]):
        filename = f"<lesson 10, cell {number}>"  # Triton reads a kernel's source: keep it where inspect looks
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), namespace)
    return namespace


def _kernel_rows(rank, world_size, norm_shape, attention_shape, repeat):
    device = my_device()
    if device.type != "cuda":
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined
    kernels = lesson_kernels()
    rows_, cols = norm_shape
    x = torch.randn(rows_, cols, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(cols, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    least_bytes = 5 * x.numel() * x.element_size()  # x twice (forward, backward), y, dy and dx once each
    rows = []
    norms = {"fused (Triton, 2 kernels)": kernels["FusedRMSNorm"].apply, "unfused (PyTorch operators)":
             kernels["unfused_rms_norm"], "F.rms_norm": lambda x, w: F.rms_norm(x, (cols,), w, eps=1e-6)}
    for name, norm in norms.items():
        seconds = time_call(lambda: norm(x, w).backward(dy), repeat=repeat, device=device)
        rows.append({"kernel": f"RMSNorm fwd+bwd {rows_}×{cols} bf16", "version": name, "ms": seconds * 1e3,
                     "GB/s (least bytes)": least_bytes / seconds / 1e9, "TFLOP/s": None})
    heads, n, d = attention_shape
    q, k, v = (torch.randn(1, heads, n, d, device=device, dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * heads * n * n * d / 2  # causal: half of q kᵀ and P v
    attentions = {"Triton forward (lesson)": lambda: kernels["TritonFlashAttention"].apply(q, k, v, True),
                  "SDPA forward": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    for name, attend in attentions.items():
        seconds = time_call(attend, repeat=repeat, device=device)
        rows.append({"kernel": f"causal attention n={n}, {heads} heads of {d}, bf16", "version": name,
                     "ms": seconds * 1e3, "GB/s (least bytes)": None, "TFLOP/s": flops / seconds / 1e12})
    return rows


def lesson10_kernels(plan: Plan) -> dict:
    norm_shape = plan.size((16384, 4096), (8, 48))
    attention_shape = plan.size((16, 4096, 64), (2, 64, 16))
    rows = plan.run(_kernel_rows, 1, norm_shape, attention_shape, plan.size(5, 1))[0]
    return {"rows": rows,
            "setup": "the lesson's kernels (solutions/lesson10), compiled by Triton; RMSNorm forward + backward "
                     "through its autograd Function vs the same formula as PyTorch operators and F.rms_norm; the "
                     "FlashAttention-2 forward kernel (64 × 32 tiles, through its autograd Function) vs SDPA's "
                     "forward; median of the repeats",
            "notes": "least bytes = what any RMSNorm forward + backward must move (x twice, y, dy, dx); TFLOP/s "
                     "counts 4·heads·n²·d/2 for causal attention"}
