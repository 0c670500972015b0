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
from coursekit.memory import profile_memory
from coursekit.timing import time_call

from .evidence_common import Plan, mib

LESSON = Path(__file__).resolve().parent.parent / "solutions" / "lesson10" / "10_triton_kernels.ipynb"
PREAMBLE = "import math\nimport torch\nimport torch.nn.functional as F\nimport triton\nimport triton.language as tl\n"
DEFINES = ("def rmsnorm_fwd_kernel", "class FusedRMSNorm", "def flash_fwd_kernel", "class TritonFlashAttention",
           "def linear_ce_fwd_kernel", "class FusedLinearCrossEntropy")


def lesson_kernels(edit=lambda source: source) -> dict:
    """The namespace of the lesson's cells that define its kernels and their autograd Functions (``edit``: a change
    to each cell's source first, for a test that plants a defect)."""
    cells = [edit("".join(c["source"])) for c in json.loads(LESSON.read_text())["cells"] if c["cell_type"] == "code"]
    namespace = {"__name__": "lesson10_kernels"}
    for number, source in enumerate([PREAMBLE, *(s for s in cells if any(d in s for d in DEFINES))]):
        filename = f"<lesson 10, cell {number}>"  # Triton reads a kernel's source: keep it where inspect looks
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), namespace)
    return namespace


def _cross_entropy_rows(kernels, ce_shape, repeat, device) -> list[dict]:
    """The lesson's fused linear + cross-entropy (Section 5) against PyTorch's logits, forward + backward: time and
    the peak bytes above the inputs (CUDA's counters; none in a dry run, whose profiler would time the interpreter)."""
    tokens, vocab, dim = ce_shape
    h = torch.randn(tokens, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(vocab, dim, device=device) / dim**0.5).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), device=device)
    versions = {"fused (Triton forward, chunked backward)": lambda: kernels["FusedLinearCrossEntropy"].apply(h, w, y),
                "F.cross_entropy(h @ W.T)": lambda: F.cross_entropy(h @ w.T, y)}
    rows = []
    for name, loss in versions.items():
        seconds = time_call(lambda: loss().backward(), repeat=repeat, device=device)
        peak = profile_memory(lambda: loss().backward(), device)[0] if device.type == "cuda" else None
        rows.append({"kernel": f"linear + cross-entropy {tokens}×{dim} → {vocab} words, bf16 inputs", "version": name,
                     "ms": seconds * 1e3, "GB/s (least bytes)": None, "TFLOP/s": None,
                     "peak MiB": mib(peak) if peak is not None else None})
    return rows


def _kernel_rows(rank, world_size, norm_shape, attention_shape, ce_shape, repeat):
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
    try:  # the newest section of the lesson: a compile failure here must not cost the rows above
        return rows + _cross_entropy_rows(kernels, ce_shape, repeat, device)
    except Exception as exc:  # noqa: BLE001  (recorded, with its type, in place of the rows)
        return rows + [{"kernel": "linear + cross-entropy", "version": f"failed: {type(exc).__name__}: {exc}"[:200],
                        "ms": None, "GB/s (least bytes)": None, "TFLOP/s": None, "peak MiB": None}]


def lesson10_kernels(plan: Plan) -> dict:
    norm_shape = plan.size((16384, 4096), (8, 48))
    attention_shape = plan.size((16, 4096, 64), (2, 64, 16))
    ce_shape = plan.size((16384, 65536, 128), (32, 200, 16))  # tokens, vocabulary, features
    rows = plan.run(_kernel_rows, 1, norm_shape, attention_shape, ce_shape, plan.size(5, 1))[0]
    return {"rows": rows,
            "setup": "the lesson's kernels (solutions/lesson10), compiled by Triton; RMSNorm forward + backward "
                     "through its autograd Function vs the same formula as PyTorch operators and F.rms_norm; the "
                     "FlashAttention-2 forward kernel (64 × 32 tiles, through its autograd Function) vs SDPA's "
                     "forward; the fused linear + cross-entropy (Triton forward over vocabulary chunks, PyTorch "
                     "backward by chunks) vs PyTorch's logits, forward + backward; median of the repeats",
            "notes": "least bytes = what any RMSNorm forward + backward must move (x twice, y, dy, dx); TFLOP/s "
                     "counts 4·heads·n²·d/2 for causal attention; peak MiB = bytes allocated above the inputs during "
                     "one forward + backward (CUDA's counters)"}
