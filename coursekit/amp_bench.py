"""Lesson 2's mixed-precision cost benchmark, shared with the GPU evidence recorder.

One training step of a small pre-norm transformer block in float32, in bfloat16 (autocast) and in
float16 (autocast + GradScaler): median step time and peak memory. The lesson runs it at a CPU-sized
shape; ``python3 -m bench.gpu_evidence --out DIR`` runs ``amp_rows(device, **GPU_SHAPE)`` on a GPU and stores the
rows under ``SECTION`` in coursekit/results/gpu_evidence.json, which the lesson then shows as recorded.
"""
import math

import torch
from torch import nn

from .memory import mib, peak_memory_bytes, profile_memory
from .timing import time_call

SECTION = "lesson2_amp"
GPU_SHAPE = {"batch": 16, "seq": 512, "width": 1024, "heads": 16}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TinyTransformerBlock(nn.Module):
    """Pre-norm block: x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)) with a GELU.

    The softmax is a module (not a function call) so that forward hooks can see its dtype.
    """

    def __init__(self, width: int = 64, heads: int = 4, mlp_ratio: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.softmax = nn.Softmax(dim=-1)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp_in = nn.Linear(width, mlp_ratio * width)
        self.act = nn.GELU()
        self.mlp_out = nn.Linear(mlp_ratio * width, width)

    def forward(self, x):  # x: (batch, seq, width)
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        attention = self.softmax(q @ k.transpose(-2, -1) / math.sqrt(w // self.heads))
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, s, w))
        return x + self.mlp_out(self.act(self.mlp_in(self.norm2(x))))


def _problem(dtype: torch.dtype, device: torch.device, *, batch: int, seq: int, width: int, heads: int = 4,
             depth: int = 1):
    """``depth`` transformer blocks (one by default), seeded data, and the loss computed under autocast."""
    torch.manual_seed(0)
    model = (TinyTransformerBlock(width, heads) if depth == 1
             else nn.Sequential(*[TinyTransformerBlock(width, heads) for _ in range(depth)])).to(device)
    x = torch.randn(batch, seq, width, device=device)
    target = torch.randn(batch, seq, width, device=device)
    low_precision = dtype != torch.float32

    def loss():
        with torch.autocast(device.type, dtype=dtype if low_precision else torch.bfloat16, enabled=low_precision):
            return nn.functional.mse_loss(model(x), target)

    return model, loss


def make_step(dtype: torch.dtype, device: torch.device, **shape):
    """A closure running one full training step (forward, loss, backward, SGD step) and the model it trains."""
    device = torch.device(device)
    model, loss = _problem(dtype, device, **shape)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    def step():
        scaler.scale(loss()).backward()
        scaler.step(optimizer)
        scaler.update()
        # Cleared at the end, not the start: everything the step allocates is also freed inside it,
        # which is what the CPU profiler needs to measure its peak.
        optimizer.zero_grad(set_to_none=True)

    return step, model


def held_after_forward(dtype: torch.dtype, device, **shape) -> int:
    """Bytes the forward pass leaves allocated for the backward: the activations it saved (under autocast in
    16 bits where autocast computed in 16 bits) and the 16-bit weight copies those products use."""
    device = torch.device(device)
    _, loss = _problem(dtype, device, **shape)
    loss()  # warm-up: one-off allocations
    kept = []
    _, held = profile_memory(lambda: kept.append(loss()), device)
    kept.clear()
    return held


def step_cost(dtype: torch.dtype, device, *, repeat: int = 3, **shape) -> dict:
    """Median step time (ms) and peak memory above the resting state (MiB) of one training step."""
    step, model = make_step(dtype, device, **shape)
    seconds = time_call(step, repeat=repeat, warmup=1, device=device)
    peak = peak_memory_bytes(step, device)
    n_params = sum(p.numel() for p in model.parameters())
    return {"dtype": str(dtype).removeprefix("torch."), "step ms": seconds * 1e3, "peak MiB": mib(peak),
            "params": n_params}


def matmul_ms(n: int, dtype: torch.dtype, device, *, repeat: int = 3) -> float:
    """Median time of one n×n @ n×n matrix product (ms)."""
    a = torch.randn(n, n, device=device).to(dtype)
    return time_call(lambda: a @ a, repeat=repeat, warmup=1, device=device) * 1e3


def amp_rows(device, *, matmul_n: int = 4096, repeat: int = 5, **shape) -> list[dict]:
    """One row per dtype: step time, peak memory, memory held from forward to backward and an n×n matmul,
    each also relative to float32."""
    rows = []
    for dtype in DTYPES.values():
        row = step_cost(dtype, device, repeat=repeat, **shape)
        row["held after forward MiB"] = mib(held_after_forward(dtype, device, **shape))
        row[f"matmul {matmul_n}² ms"] = matmul_ms(matmul_n, dtype, device, repeat=repeat)
        rows.append(row)
    base = rows[0]
    for row in rows:
        row["time vs fp32"] = row["step ms"] / base["step ms"]
        row["memory vs fp32"] = row["peak MiB"] / base["peak MiB"]
        row["held vs fp32"] = row["held after forward MiB"] / base["held after forward MiB"]
    return rows
