"""Submissions for ``TritonFlashAttention`` (Lesson 10): FlashAttention-2's forward as a Triton kernel, and the
autograd Function that launches it with a backward in PyTorch from the saved L.

Each source is a student's exercise cell, run after the notebook's setup cell (Triton's interpreter on this CPU).
The wrong variants are the mistakes the exercise names (no rescale of the running output, L without the maximum,
the causal mask off by one at the diagonal, no mask on the last key tile, the scale applied twice) and issue #40's
(causal tiles not skipped, a grid that covers only the first batch·head).
"""
from variants import EVERY_CHECK

REFERENCE = '''
@triton.jit
def flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, L_ptr, n, scale,
                     D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    tile, bh = tl.program_id(0), tl.program_id(1)   # query tile, batch·head
    base = bh * n * D                                # q, k, v, o: contiguous (batch·heads, n, D)
    rows, dims = tile * BLOCK_M + tl.arange(0, BLOCK_M), tl.arange(0, D)
    q = tl.load(q_ptr + base + rows[:, None] * D + dims[None, :], mask=rows[:, None] < n, other=0.0).to(tl.float32)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)   # running maximum of each query row
    row_sum = tl.zeros((BLOCK_M,), tl.float32)           # running sum ℓ of exp(s − m)
    acc = tl.zeros((BLOCK_M, D), tl.float32)             # running output, unnormalised
    end = tl.minimum((tile + 1) * BLOCK_M, n) if CAUSAL else n   # causal: no key tile after the diagonal
    for start in range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + base + keys[:, None] * D + dims[None, :], mask=keys[:, None] < n, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + base + keys[:, None] * D + dims[None, :], mask=keys[:, None] < n, other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * scale
        keep = keys[None, :] < n
        if CAUSAL:
            keep = keep & (keys[None, :] <= rows[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)                        # rescales what was summed under the old maximum
        row_sum = row_sum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    o = acc / row_sum[:, None]
    tl.store(o_ptr + base + rows[:, None] * D + dims[None, :], o.to(o_ptr.dtype.element_ty), mask=rows[:, None] < n)
    tl.store(L_ptr + bh * n + rows, m + tl.log(row_sum), mask=rows < n)


class TritonFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        b, h, n, d = q.shape
        q3, k3, v3 = (t.reshape(b * h, n, d).contiguous() for t in (q, k, v))
        o = torch.empty_like(q3)
        L = torch.empty(b * h, n, device=q.device, dtype=torch.float32)
        block_m, block_n = 64, 32
        grid = (triton.cdiv(n, block_m), b * h)
        flash_fwd_kernel[grid](q3, k3, v3, o, L, n, d ** -0.5, D=d, BLOCK_M=block_m, BLOCK_N=block_n,
                               CAUSAL=causal)
        ctx.save_for_backward(q3, k3, v3, o, L)   # L, not the n × n probabilities
        ctx.causal, ctx.shape = causal, q.shape
        return o.view(q.shape)

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, L = ctx.saved_tensors
        scale = q.shape[-1] ** -0.5
        q, k, v, o, do = (t.float() for t in (q, k, v, o, do.reshape(o.shape)))
        s = q @ k.transpose(-1, -2) * scale
        if ctx.causal:
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
        p = torch.exp(s - L[..., None])                  # recomputed from L
        dv = p.transpose(-1, -2) @ do
        ds = p * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
        dq, dk = ds @ k * scale, ds.transpose(-1, -2) @ q * scale
        return (*(g.to(ctx.saved_tensors[0].dtype).view(ctx.shape) for g in (dq, dk, dv)), None)
'''


def edit(source: str, *changes: tuple[str, str]) -> str:
    """The source with each (old, new) replaced; every old text must be there (a stale variant fails loudly)."""
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    return source


FUNCTION = REFERENCE[REFERENCE.index("class TritonFlashAttention"):]

EXP2_WITH_A_HELPER = '''
@triton.jit
def _attend(acc, l_i, m_i, q, k_base, v_base, offs_m, lo, hi, n, qk_scale,
            D: tl.constexpr, BLOCK_N: tl.constexpr, MASK_DIAGONAL: tl.constexpr):
    """One stretch of key tiles, in base 2 (as Triton's tutorial): m_i is in units of log2."""
    offs_d = tl.arange(0, D)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kt = tl.load(k_base + cols[None, :] * D + offs_d[:, None], mask=cols[None, :] < n, other=0.0).to(tl.float32)
        qk = tl.dot(q, kt) * qk_scale
        ok = cols[None, :] < n
        if MASK_DIAGONAL:
            ok = ok & (cols[None, :] <= offs_m[:, None])
        qk = tl.where(ok, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * D + offs_d[None, :], mask=cols[:, None] < n, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, L_ptr, n, scale,
                     D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m, off_bh = tl.program_id(0), tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + off_bh * n * D + offs_m[:, None] * D + offs_d[None, :], mask=offs_m[:, None] < n,
                other=0.0).to(tl.float32)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    qk_scale = scale * 1.44269504
    k_base, v_base = k_ptr + off_bh * n * D, v_ptr + off_bh * n * D
    if CAUSAL:   # the tiles before the diagonal need no causal mask; then the diagonal tiles, masked
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, offs_m, 0, start_m * BLOCK_M, n, qk_scale,
                                D, BLOCK_N, False)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, offs_m, start_m * BLOCK_M,
                                (start_m + 1) * BLOCK_M, n, qk_scale, D, BLOCK_N, True)
    else:
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, offs_m, 0, n, n, qk_scale, D, BLOCK_N, False)
    acc = acc / l_i[:, None]
    tl.store(o_ptr + off_bh * n * D + offs_m[:, None] * D + offs_d[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < n)
    tl.store(L_ptr + off_bh * n + offs_m, m_i / 1.44269504 + tl.log(l_i), mask=offs_m < n)

'''

ADVANCING_POINTERS = '''
@triton.jit
def flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, L_ptr, n, scale,
                     D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    j = tl.arange(0, BLOCK_N)
    c = tl.arange(0, D)
    q_ptrs = q_ptr + pid_bh * n * D + i[:, None] * D + c[None, :]
    k_ptrs = k_ptr + pid_bh * n * D + j[:, None] * D + c[None, :]
    v_ptrs = v_ptr + pid_bh * n * D + j[:, None] * D + c[None, :]
    q = tl.load(q_ptrs, mask=i[:, None] < n, other=0.0)
    q = q.to(tl.float32) * scale                        # the scale folded into q, once
    m_run = tl.zeros((BLOCK_M,), tl.float32) - 1e30
    l_run = tl.zeros((BLOCK_M,), tl.float32)
    o = tl.zeros((BLOCK_M, D), tl.float32)
    if CAUSAL:
        tiles = tl.cdiv(tl.minimum((pid_m + 1) * BLOCK_M, n), BLOCK_N)
    else:
        tiles = tl.cdiv(n, BLOCK_N)
    for t in range(0, tiles):
        kj = t * BLOCK_N + j
        k = tl.load(k_ptrs, mask=kj[:, None] < n, other=0.0).to(tl.float32)
        v = tl.load(v_ptrs, mask=kj[:, None] < n, other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k))
        visible = kj[None, :] < n
        if CAUSAL:
            visible = visible & (kj[None, :] <= i[:, None])
        s = tl.where(visible, s, -1e30)
        m_next = tl.maximum(m_run, tl.max(s, 1))
        p = tl.where(visible, tl.exp(s - m_next[:, None]), 0.0)
        l_run = l_run * tl.exp(m_run - m_next) + tl.sum(p, 1)
        o = o * tl.exp(m_run - m_next)[:, None] + tl.dot(p, v)
        m_run = m_next
        k_ptrs += BLOCK_N * D
        v_ptrs += BLOCK_N * D
    tl.store(o_ptr + pid_bh * n * D + i[:, None] * D + c[None, :], (o / l_run[:, None]).to(o_ptr.dtype.element_ty),
             mask=i[:, None] < n)
    tl.store(L_ptr + pid_bh * n + i, m_run + tl.log(l_run), mask=i < n)


class TritonFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        shape = q.shape
        n, d = shape[-2], shape[-1]
        q, k, v = (t.contiguous().view(-1, n, d) for t in (q, k, v))
        o = torch.zeros_like(q)
        L = torch.zeros(q.shape[0], n, dtype=torch.float32, device=q.device)
        print(f"attention over {q.shape[0]} batch·heads of {n} tokens")
        flash_fwd_kernel[(triton.cdiv(n, 16), q.shape[0])](q, k, v, o, L, n, 1.0 / d ** 0.5, D=d, BLOCK_M=16,
                                                          BLOCK_N=16, CAUSAL=causal)
        ctx.save_for_backward(q, k, v, o, L)
        ctx.causal, ctx.shape = causal, shape
        return o.view(shape)

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, L = ctx.saved_tensors
        scale = 1.0 / q.shape[-1] ** 0.5
        grad_o = grad_o.contiguous().view(o.shape)
        s = torch.einsum("bid,bjd->bij", q, k) * scale
        if ctx.causal:
            n = s.shape[-1]
            s = torch.where(torch.tril(torch.ones(n, n, dtype=torch.bool, device=s.device)), s, -torch.inf)
        p = (s - L.unsqueeze(-1)).exp()
        dp = torch.einsum("bid,bjd->bij", grad_o, v)
        delta = (p * dp).sum(-1, keepdim=True)            # = rowsum(do ⊙ o)
        ds = p * (dp - delta) * scale
        dq = torch.einsum("bij,bjd->bid", ds, k)
        dk = torch.einsum("bij,bid->bjd", ds, q)
        dv = torch.einsum("bij,bid->bjd", p, grad_o)
        return dq.view(ctx.shape), dk.view(ctx.shape), dv.view(ctx.shape), None
'''

CORRECT = {
    "online_softmax_one_loop_masked_diagonal": REFERENCE,
    "base_2_with_a_helper_and_two_causal_loops": EXP2_WITH_A_HELPER + FUNCTION,
    "advancing_pointers_scale_in_q_einsum_backward": ADVANCING_POINTERS,
    "small_blocks_in_the_wrapper": edit(REFERENCE, ("block_m, block_n = 64, 32", "block_m, block_n = 16, 16"),
                                        ("o = torch.empty_like(q3)", "o = torch.zeros_like(q3)")),
}

WRONG = {
    "no_rescale_of_the_output": (edit(REFERENCE, ("acc = acc * alpha[:, None] + tl.dot(p, v)",
                                                  "acc = acc + tl.dot(p, v)")),
                                 ["Non-causal", "Causal:"]),
    "logsumexp_without_the_max": (edit(REFERENCE, ("m + tl.log(row_sum), mask=rows < n)", "tl.log(row_sum), mask=rows < n)")),
                          ["Non-causal", "Causal:", "The autograd Function"]),
    "causal_mask_off_by_one": (edit(REFERENCE, ("keys[None, :] <= rows[:, None]", "keys[None, :] < rows[:, None]")),
                               ["Causal:", "The autograd Function"]),
    "no_mask_on_the_last_key_tile": (edit(REFERENCE, (", mask=keys[:, None] < n, other=0.0)", ")"),
                                          ("keep = keys[None, :] < n", "keep = keys[None, :] >= 0")),
                                     ["Non-causal", "Masks"]),
    "scale_applied_twice": (edit(REFERENCE, ("other=0.0).to(tl.float32)\n    m = ",
                                             "other=0.0).to(tl.float32) * scale\n    m = ")),
                            ["Non-causal", "Causal:", "The autograd Function"]),
    "causal_tiles_not_skipped": (edit(REFERENCE, ("end = tl.minimum((tile + 1) * BLOCK_M, n) if CAUSAL else n",
                                                  "end = n")),
                                 ["Causal tiles"]),
    "grid_covers_only_the_first_batch_head": (edit(REFERENCE, ("grid = (triton.cdiv(n, block_m), b * h)",
                                                               "grid = (triton.cdiv(n, block_m), 1)")),
                                              ["The autograd Function"]),
    "does_nothing": ('''
@triton.jit
def flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, L_ptr, n, scale,
                     D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    pass


class TritonFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        return v.clone()

    @staticmethod
    def backward(ctx, do):
        return torch.zeros_like(do), torch.zeros_like(do), do, None
''', EVERY_CHECK),
    "not_implemented": ('''
@triton.jit
def flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, L_ptr, n, scale,
                     D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # YOUR CODE HERE
    raise NotImplementedError()


class TritonFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        # YOUR CODE HERE
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, do):
        # YOUR CODE HERE
        raise NotImplementedError()
''', EVERY_CHECK),
}
