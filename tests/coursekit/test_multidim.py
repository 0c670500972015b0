"""coursekit.multidim and the transformer block under tensor parallelism (Lesson 8's first section)."""
import torch

from coursekit.multidim import bytes_sent, heads_by_rank, qkv_rows_by_rank
from coursekit.transformer import Block, Config


def test_rows_by_rank_put_each_ranks_q_k_v_side_by_side():
    order = qkv_rows_by_rank(4, 2).tolist()
    assert order == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]


def test_a_rank_s_block_of_reordered_rows_is_its_heads_attention():
    """Rank r's contiguous third of the reordered q/k/v weight, run alone, gives heads r·H/t … of the full block."""
    config = Config(n_embd=16, n_head=4)
    torch.manual_seed(0)
    split = heads_by_rank(Block(config), 2)
    torch.manual_seed(0)
    full = Block(config)
    x = torch.randn(2, 5, 16)
    q, k, v = full.attn.qkv(x).chunk(3, dim=-1)
    for rank in range(2):
        rows = slice(rank * 24, (rank + 1) * 24)
        mine = torch.nn.functional.linear(x, split.attn.qkv.weight[rows], split.attn.qkv.bias[rows])
        heads = slice(rank * 8, (rank + 1) * 8)
        for got, want in zip(mine.chunk(3, dim=-1), (q, k, v)):
            # round-off apart: a product of 24 output rows and one of 48 may run different CPU kernels
            torch.testing.assert_close(got, want[..., heads], rtol=1e-6, atol=1e-6)


def test_the_block_still_computes_the_same_function():
    """Attention takes its sizes from the tensors (Lesson 8's tensor parallelism needs it): one process unchanged."""
    torch.manual_seed(0)
    block = Block(Config(n_embd=16, n_head=4))
    x = torch.randn(2, 5, 16)
    b, s, h = x.shape
    q, k, v = block.attn.qkv(block.ln_1(x)).split(h, dim=2)
    q, k, v = (t.view(b, s, 4, 4).transpose(1, 2) for t in (q, k, v))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    attn = block.attn.proj(y.transpose(1, 2).reshape(b, s, h))
    want = x + attn
    want = want + block.mlp(block.ln_2(want))
    assert torch.allclose(block(x), want, atol=1e-6)


def _sent(rank, world_size):
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        if rank == 0:
            dist.send(torch.ones(10), 1)
        else:
            dist.recv(torch.empty(10), 0)
        dist.all_to_all_single(torch.empty(8), torch.ones(8))
        dist.all_reduce(torch.ones(100))  # not counted
    return bytes_sent(prof, world_size)


def test_bytes_sent_counts_sends_and_the_all_to_all_part_that_leaves():
    from coursekit.dist import launch

    assert launch(_sent, 2, backend="gloo", timeout=60) == [4 * 10 + 4 * 4, 4 * 4]
