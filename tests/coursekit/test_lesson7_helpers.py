"""Lesson 7's helpers: the private or version-dependent torch APIs behind one function each (coursekit.ops,
coursekit.fp8, coursekit.compiling), and the transformer block's saved bytes, which the lesson's formula promises to the byte."""
import contextlib
import io

import pytest
import torch
import torch.nn.functional as F

from coursekit.compiling import graph_breaks
from coursekit.fp8 import fp8_matmul_ms, fp8_supported, per_tensor_scale, scaled_matmul, to_fp8
from coursekit.ops import count_ops, watch_ops
from coursekit.transformer import Block, Config, Dropout, naive_attention


def saved_bytes(module, *inputs) -> int:
    """What the lesson's exercise counts (its own copy: the exercise's reference lives in the notebook)."""
    own = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in own:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return sum(saved.values())


# ---- coursekit.ops: a dispatch mode sees forward and backward operators ----------------------------------

def test_watch_ops_sees_the_backward_and_the_largest_output():
    x = torch.randn(4, 8, requires_grad=True)
    seen = watch_ops(lambda: (x @ x.t()).sum().backward())
    assert seen.counts["mm"] >= 3  # one forward, two in backward
    assert seen.largest == 32  # x.grad (4 × 8) is larger than the 4 × 4 product
    q, k, v = (torch.randn(1, 1, 64, 8, requires_grad=True) for _ in range(3))
    assert watch_ops(lambda: naive_attention(q, k, v, True).sum().backward()).largest == 64 * 64


def test_count_ops_counts_by_name():
    counts = count_ops(lambda: F.gelu(torch.randn(3)).sum())
    assert counts["gelu"] == 1 and counts["sum"] == 1


# ---- coursekit.fp8 ---------------------------------------------------------------------------------------

def test_scaled_matmul_equals_dequantise_then_multiply():
    torch.manual_seed(0)
    a, w = torch.randn(32, 64), torch.randn(48, 64) * 0.01
    sa, sw = per_tensor_scale(a.abs().max(), torch.float8_e4m3fn), per_tensor_scale(w.abs().max(), torch.float8_e4m3fn)
    a8, w8 = to_fp8(a, sa), to_fp8(w, sw)
    assert a8.dtype == torch.float8_e4m3fn and a8.float().abs().max() == 448
    out = scaled_matmul(a8, w8.t(), sa, sw)
    dequantised = (a8.float() * sa) @ (w8.float() * sw).t()
    # Equal up to float32 round-off, not bitwise: the two products may run different CPU kernels (oneDNN with AMX,
    # AVX-512, AVX2), which sum in different orders; on a Xeon with AMX they differ by 6e-8.
    assert (out - dequantised).abs().max() <= 1e-5 * dequantised.abs().max()
    assert ((out - a @ w.t()).norm() / (a @ w.t()).norm()) < 0.1
    assert fp8_supported("cpu") and fp8_matmul_ms(32, "cpu", repeat=1) > 0


def test_scaled_matmul_uses_the_public_api_where_torch_has_it():
    a8 = to_fp8(torch.randn(8, 16), torch.tensor(0.01))
    public = F.scaled_mm(a8, a8.t(), torch.tensor(0.01), F.ScalingType.TensorWise, torch.tensor(0.01),
                         F.ScalingType.TensorWise, output_dtype=torch.float32)
    assert torch.equal(scaled_matmul(a8, a8.t(), torch.tensor(0.01), torch.tensor(0.01)), public)  # one code path


def test_e4m3_flushes_below_half_the_smallest_subnormal():
    smallest_subnormal = 2.0 ** -9  # E4M3: 2^-6 smallest normal, three mantissa bits
    cast = torch.tensor([9e-4, 2.0 ** -10, 1e-3]).to(torch.float8_e4m3fn).float().tolist()
    assert cast == [0.0, 0.0, smallest_subnormal]  # half of it rounds to even, i.e. to zero; 1e-3 rounds up


def test_to_fp8_clamps_instead_of_overflowing():
    big = torch.tensor([1e6, -1e6])
    assert torch.isinf(big.to(torch.float8_e5m2).float()).all()  # the plain cast overflows ...
    assert to_fp8(big, torch.tensor(1.0), torch.float8_e5m2).float().tolist() == [57344.0, -57344.0]  # ... this not


# ---- coursekit.compiling ------------------------------------------------------------------------------------

def test_graph_breaks_lists_them_and_writes_nothing_to_stderr():
    def chatty(x):
        y = torch.sin(x) * 2
        print("mean so far:", y.mean().item())
        if y.sum() > 0:
            y = torch.cos(y)
        return y + 1

    def clean(x):
        return torch.cos(torch.sin(x) * 2) + 1

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        found = graph_breaks(chatty, torch.ones(8))
    assert found["breaks"] == 2 and found["graphs"] == 3 and len(found["reasons"]) == 2
    assert graph_breaks(clean, torch.ones(8)) == {"graphs": 1, "breaks": 0, "reasons": []}


# ---- coursekit.transformer: the bytes the lesson's formula promises -----------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("attention,dropout", [("naive", 0.0), ("naive", 0.1), ("sdpa", 0.0)])
def test_a_block_saves_the_formulas_bytes(dtype, attention, dropout):
    s, b, h, a = 24, 2, 32, 4
    torch.manual_seed(0)
    block = Block(Config(n_embd=h, n_head=a, dropout=dropout, attention=attention)).to(dtype).train()
    x = torch.randn(b, s, h, dtype=dtype, requires_grad=True)
    e, mask = dtype.itemsize, 1 if dropout else 0
    formula = (16 * e + 2 * mask) * s * b * h
    formula += (e + mask * (1 + e)) * a * s * s * b if attention == "naive" else 4 * a * s * b
    layer_norm_statistics = 2 * 2 * s * b * e  # mean and 1/σ per token, two LayerNorms (CPU: the input's dtype)
    causal_mask = s * s if attention == "naive" else 0
    assert saved_bytes(block, x) == formula + layer_norm_statistics + causal_mask
    if dtype == torch.bfloat16 and dropout:
        assert formula == 34 * s * b * h + 5 * a * s * s * b  # Korthikanti et al. (2022)


def test_dropout_keeps_a_one_byte_mask_and_only_builtin_attention_drops_probabilities():
    x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    assert saved_bytes(Dropout(0.5).train(), x) == x.numel()  # a bool mask
    assert saved_bytes(torch.nn.Dropout(0.5).train(), x) == 2 * x.numel()  # F.dropout on a CPU: bf16 noise
    assert torch.equal(Dropout(0.5).eval()(x), x)
    custom = Block(Config(n_embd=16, n_head=2, dropout=0.5, attention=naive_attention))
    assert custom.attn.attention_dropout == 0.0 and Block(Config(dropout=0.5)).attn.attention_dropout == 0.5
