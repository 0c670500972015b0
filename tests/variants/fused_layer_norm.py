"""Submissions for ``FusedLayerNorm`` (Lesson 10): two Triton kernels and the autograd Function that launches them.

Each source is a student's exercise cell, run after the notebook's setup cell (Triton's interpreter on this CPU).
The wrong variants are the mistakes issue #40 names (a backward without the mean term, statistics in bfloat16, no
mask on the last chunk, a grid that covers only the first rows) and a kernel that ignores BLOCK.
"""
from variants import EVERY_CHECK

REFERENCE = '''
@triton.jit
def layer_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row, y_row = x_ptr + row * n_cols, y_ptr + row * n_cols
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        total += tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    mean = tl.sum(total, axis=0) / n_cols
    squares = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        squares += tl.where(cols < n_cols, (x - mean) * (x - mean), 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, ((x - mean) * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def layer_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr, n_cols,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0)
    start_of_row = row * n_cols
    mean, rstd = tl.load(mean_ptr + row), tl.load(rstd_ptr + row)
    sum_g = tl.zeros((BLOCK,), dtype=tl.float32)
    sum_g_x_hat = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + start_of_row + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + start_of_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        g = dy * w
        sum_g += g
        sum_g_x_hat += g * (x - mean) * rstd
    mean_g, mean_g_x_hat = tl.sum(sum_g, axis=0) / n_cols, tl.sum(sum_g_x_hat, axis=0) / n_cols
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + start_of_row + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + start_of_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x_hat = (x - mean) * rstd
        dx = rstd * (dy * w - mean_g - x_hat * mean_g_x_hat)
        tl.store(dx_ptr + start_of_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(dw_ptr + start_of_row + cols, dy * x_hat, mask=mask)
        tl.store(db_ptr + start_of_row + cols, dy, mask=mask)


class FusedLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        x2d = x.reshape(-1, x.shape[-1]).contiguous()
        rows, cols = x2d.shape
        y = torch.empty_like(x2d)
        mean = torch.empty(rows, device=x.device, dtype=torch.float32)
        rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
        block = min(triton.next_power_of_2(cols), 1024)
        layer_norm_fwd_kernel[(rows,)](x2d, weight, bias, y, mean, rstd, cols, eps, BLOCK=block)
        ctx.save_for_backward(x2d, weight, mean, rstd)
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2d, weight, mean, rstd = ctx.saved_tensors
        rows, cols = x2d.shape
        dx = torch.empty_like(x2d)
        dw = torch.empty(rows, cols, device=x2d.device, dtype=torch.float32)
        db = torch.empty(rows, cols, device=x2d.device, dtype=torch.float32)
        block = min(triton.next_power_of_2(cols), 1024)
        layer_norm_bwd_kernel[(rows,)](dy.reshape(rows, cols).contiguous(), x2d, weight, mean, rstd, dx, dw, db,
                                       cols, BLOCK=block)
        return dx.reshape(dy.shape), dw.sum(0).to(weight.dtype), db.sum(0).to(weight.dtype), None
'''


def edit(source: str, *changes: tuple[str, str]) -> str:
    """The source with each (old, new) replaced; every old text must be there (a stale variant fails loudly)."""
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    return source


ONE_PASS_FORWARD = '''
@triton.jit
def layer_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):
    """Sum and sum of squares in one pass (float32), then normalise: a valid style at these means."""
    pid = tl.program_id(0)
    s1 = tl.zeros((BLOCK,), tl.float32)
    s2 = tl.zeros((BLOCK,), tl.float32)
    for i in range(tl.cdiv(n_cols, BLOCK)):
        offs = i * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + pid * n_cols + offs, mask=offs < n_cols, other=0.).to(tl.float32)
        s1 += v
        s2 += v * v
    mu = tl.sum(s1, 0) / n_cols
    var = tl.sum(s2, 0) / n_cols - mu * mu
    inv = tl.rsqrt(var + eps)
    tl.store(mean_ptr + pid, mu)
    tl.store(rstd_ptr + pid, inv)
    for i in range(tl.cdiv(n_cols, BLOCK)):
        offs = i * BLOCK + tl.arange(0, BLOCK)
        m = offs < n_cols
        v = tl.load(x_ptr + pid * n_cols + offs, mask=m).to(tl.float32)
        out = (v - mu) * inv * tl.load(w_ptr + offs, mask=m).to(tl.float32) + tl.load(b_ptr + offs, mask=m)
        tl.store(y_ptr + pid * n_cols + offs, out.to(y_ptr.dtype.element_ty), mask=m)
'''

CORRECT = {
    "two_passes_and_one_block_per_row_in_the_wrapper": REFERENCE,
    "one_pass_statistics_and_cdiv_loops": edit(REFERENCE, (REFERENCE[:REFERENCE.index("\n\n@triton.jit\ndef layer_norm_bwd")],
                                                           ONE_PASS_FORWARD.rstrip("\n"))),
    "small_block_in_the_wrapper_and_zeros_buffers": edit(
        REFERENCE, ("block = min(triton.next_power_of_2(cols), 1024)\n        layer_norm_fwd",
                    "block = 16\n        layer_norm_fwd"),
        ("dw = torch.empty(rows, cols", "dw = torch.zeros(rows, cols"),
        ("dw.sum(0).to(weight.dtype), db.sum(0)", "dw.sum(dim=0).to(weight.dtype), torch.sum(db, 0)"),
        ("rows, cols = x2d.shape\n        y =",
         "rows, cols = x2d.shape\n        print(f\"LayerNorm over {rows} rows\")\n        y =")),
    "x_hat_stored_as_where_and_view": edit(
        REFERENCE, ("sum_g_x_hat += g * (x - mean) * rstd", "sum_g_x_hat += tl.where(mask, g * ((x - mean) * rstd), 0.0)"),
        ("x2d = x.reshape(-1, x.shape[-1]).contiguous()", "x2d = x.contiguous().view(-1, x.shape[-1])"),
        ("dy.reshape(rows, cols).contiguous()", "dy.contiguous().view(rows, cols)")),
}

WRONG = {
    "backward_without_the_mean_term": (edit(REFERENCE, ("dx = rstd * (dy * w - mean_g - x_hat * mean_g_x_hat)",
                                                         "dx = rstd * (dy * w - x_hat * mean_g_x_hat)")),
                                       ["Backward kernel", "The autograd Function"]),
    "statistics_in_bfloat16": (edit(REFERENCE,
                                    ("mean = tl.sum(total, axis=0) / n_cols",
                                     "mean = (tl.sum(total, axis=0) / n_cols).to(x_ptr.dtype.element_ty)"),
                                    ("rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n_cols + eps)",
                                     "rstd = (1.0 / tl.sqrt(tl.sum(squares, axis=0) / n_cols + eps)).to("
                                     "x_ptr.dtype.element_ty)")),
                               ["bfloat16 rows"]),
    "bfloat16_accumulators": (edit(REFERENCE,
                                   ("total = tl.zeros((BLOCK,), dtype=tl.float32)",
                                    "total = tl.zeros((BLOCK,), dtype=x_ptr.dtype.element_ty)"),
                                   ("total += tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)",
                                    "total += tl.load(x_row + cols, mask=cols < n_cols, other=0.0)")),
                              ["bfloat16 rows"]),
    "no_mask_on_the_last_block": (edit(REFERENCE, (", mask=cols < n_cols, other=0.0", ""),
                                       (", mask=mask, other=0.0", ""), (", mask=mask)", ")"),
                                       ("tl.where(cols < n_cols, (x - mean) * (x - mean), 0.0)", "(x - mean) * (x - mean)")),
                                  ["Masks"]),
    "grid_covers_only_the_first_rows": (edit(REFERENCE, ("layer_norm_fwd_kernel[(rows,)]",
                                                         "layer_norm_fwd_kernel[(triton.cdiv(rows, block),)]"),
                                             ("layer_norm_bwd_kernel[(rows,)]",
                                              "layer_norm_bwd_kernel[(triton.cdiv(rows, block),)]")),
                                        ["The autograd Function"]),
    "one_chunk_per_row_ignoring_block": (edit(REFERENCE, ("for start in range(0, n_cols, BLOCK):", "for start in range(0, 1):")),
                                         ["Forward kernel", "Backward kernel"]),
    "does_nothing": ('''
@triton.jit
def layer_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):
    pass


@triton.jit
def layer_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr, n_cols,
                          BLOCK: tl.constexpr):
    pass


class FusedLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        return dy, torch.zeros(dy.shape[-1]), torch.zeros(dy.shape[-1]), None
''', EVERY_CHECK),
    "not_implemented": ('''
@triton.jit
def layer_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):
    # YOUR CODE HERE
    raise NotImplementedError()


@triton.jit
def layer_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr, n_cols,
                          BLOCK: tl.constexpr):
    # YOUR CODE HERE
    raise NotImplementedError()


class FusedLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        # YOUR CODE HERE
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, dy):
        # YOUR CODE HERE
        raise NotImplementedError()
''', EVERY_CHECK),
}
