"""FP8 in one place: scaling a tensor into an 8-bit format, and the scaled matrix product.

Hopper and later GPUs multiply FP8 matrices in their tensor cores, at twice the 16-bit rate; the product is
``(a / scale_a) @ (b / scale_b)`` in FP8, accumulated in wider precision (on Hopper with ``use_fast_accum``, the
fast mode, only about 14 bits: DeepSeek-V3 measured it) and multiplied back by both scales. torch 2.13 exposes it
publicly as ``torch.nn.functional.scaled_mm`` (tensor-, row- and block-wise scales); older torch only as the private
``torch._scaled_mm``, which the GPU recorder may meet on a GPU machine's own torch, so ``scaled_matmul`` is the one
place that picks (tests/coursekit/test_lesson7_helpers.py). On a CPU torch emulates it, slower than a float32 product: the CPU
shows the numerics, a GPU the speed (recorded by bench.gpu_evidence).
"""
import torch
import torch.nn.functional as F

from .timing import time_call

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def per_tensor_scale(amax: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """The float32 scale that maps a tensor whose largest magnitude is ``amax`` onto the format's largest value."""
    return (amax.float() / torch.finfo(fp8_dtype).max).clamp(min=1e-12)


def to_fp8(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """x / scale in FP8, clamped to the format's range first (e5m2 would otherwise overflow to inf)."""
    largest = torch.finfo(fp8_dtype).max
    return (x.float() / scale).clamp(-largest, largest).to(fp8_dtype)


def scaled_matmul(a8: torch.Tensor, b8: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                  out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(a8 · scale_a) @ (b8 · scale_b) for FP8 a8 (m, k) and b8 (k, n), float32 scalar scales, in ``out_dtype``.

    The kernel wants b8 column-major: pass ``w8.t()`` of a row-major (n, k) weight, as a linear layer holds it.
    Per-tensor scales only: the lesson's case (F.scaled_mm also takes row- and block-wise ones)."""
    scale_a, scale_b = scale_a.float(), scale_b.float()
    if hasattr(F, "scaled_mm"):  # public from torch 2.13
        return F.scaled_mm(a8, b8, scale_a, F.ScalingType.TensorWise, scale_b, F.ScalingType.TensorWise,
                           output_dtype=out_dtype)
    return torch._scaled_mm(a8, b8, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)


def fp8_supported(device: torch.device | str) -> bool:
    """Whether ``scaled_matmul`` runs on ``device``: any CPU (emulated), CUDA GPUs of compute capability ≥ 8.9."""
    device = torch.device(device)
    return device.type == "cpu" or (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9))


def fp8_matmul_ms(n: int, device, *, repeat: int = 3, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> float:
    """Median time of one n×n FP8 scaled matrix product with a bfloat16 result (ms)."""
    a = torch.randn(n, n, device=device)
    scale = per_tensor_scale(a.abs().max(), fp8_dtype)
    a8 = to_fp8(a, scale, fp8_dtype)
    return time_call(lambda: scaled_matmul(a8, a8.t(), scale, scale, torch.bfloat16), repeat=repeat, warmup=1,
                     device=device) * 1e3
