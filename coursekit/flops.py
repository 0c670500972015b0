"""How much arithmetic a training step does, and what fraction of the chip's peak that is (MFU).

A dense layer does one multiply and one add per weight per token forward, and twice that backward: 6 FLOPs per
parameter per token. Attention adds its two matrix products over the sequence (12·layers·seq·width per token,
forward and backward), as in the PaLM paper's definition of **model FLOPs utilisation**:

    MFU = (model FLOPs of one step / step time) / the device's peak FLOP/s.

The peak is the datasheet number for dense matrix products, which no whole training step reaches: the rest of a
step (normalisations, element-wise ops, the optimizer, communication, launch gaps) runs far below it. So a cost
model must use the *sustained* rate, MFU × peak, never the peak itself.
"""
import torch

# Dense (no 2:4 sparsity) tensor-core peaks from NVIDIA's datasheets, FLOP/s, for bfloat16 and float16.
# The most specific name first: "H100 PCIe" before "H100".
DATASHEET_PEAK_16BIT = [("H200 NVL", 835e12), ("H200", 989e12), ("H100 NVL", 835e12), ("H100 PCIe", 756e12),
                        ("H100", 989e12), ("A100", 312e12)]


def datasheet_peak(device_name: str, dtype: torch.dtype) -> float | None:
    """The datasheet's dense 16-bit peak of a known GPU, or None (unknown GPU, or float32: no fixed peak
    without TF32)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    return next((peak for name, peak in DATASHEET_PEAK_16BIT if name in device_name), None)


def transformer_flops_per_token(params: int, layers: int, seq: int, width: int) -> float:
    """Model FLOPs of one token's forward and backward pass through a transformer stack."""
    return 6 * params + 12 * layers * seq * width


def mfu(step_flops: float, step_seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the fraction of ``peak_flops`` one step sustains."""
    return step_flops / step_seconds / peak_flops


def step_mfu(dtype: torch.dtype, device, *, depth: int, batch: int, seq: int, width: int, heads: int,
             repeat: int = 3) -> dict:
    """Step time, model FLOP/s and MFU of one training step of ``depth`` transformer blocks under autocast
    (``coursekit.amp_bench.make_step``: Lesson 2's step), with the peak from the datasheet where it is known."""
    from .amp_bench import make_step
    from .timing import time_call

    device = torch.device(device)
    step, model = make_step(dtype, device, batch=batch, seq=seq, width=width, heads=heads, depth=depth)
    seconds = time_call(step, repeat=repeat, warmup=1, device=device)
    params = sum(p.numel() for p in model.parameters())
    flops = batch * seq * transformer_flops_per_token(params, depth, seq, width)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    peak = datasheet_peak(name, dtype)
    return {"dtype": str(dtype).removeprefix("torch."), "params M": params / 1e6, "tokens": batch * seq,
            "step ms": seconds * 1e3, "model TFLOP/s": flops / seconds / 1e12,
            "datasheet peak TFLOP/s": peak / 1e12 if peak else None,
            "MFU": mfu(flops, seconds, peak) if peak else None}
