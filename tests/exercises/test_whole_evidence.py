"""Issue 37, evidence a cell cannot aim at: a method scenario's evidence covers its whole result.

The memory and traffic scenarios are large, so their observations keep a few rows or columns for feedback; those
alone were the evidence, and a cell could compute just them without the method (the red team's attacks below,
both 12/12 and 10/10 before). Now each also keeps a sketch of the whole tensor (``observing.sketch``: projections
on vectors drawn from the scenario's seed, secret under a class's held-out salt), which needs every element.
Each attack earns the points of its honest parts only; the reference keeps all of them under every salt.
"""
import pytest
from conftest import reference_observation, student_observation
from submission_factory import reference_source

from autograder.exercises import get_exercise

pytestmark = pytest.mark.slow

# Plain attention everywhere, except in large problems, where only the first 8 rows of o (and of dq) are computed:
# no n_q × n_k matrix is ever made there, and the rows the observation used to keep are right.
FLASH_FIRST_ROWS = '''
import math
import torch

BLOCK_Q = BLOCK_K = 16
ROWS = 8


def _attention(q, k, v, is_causal):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        ctx.is_causal = is_causal
        if q.shape[-2] * k.shape[-2] < 2 ** 20:
            o = _attention(q, k, v, is_causal)
        else:
            o = torch.zeros_like(q)
            o[..., :ROWS, :] = _attention(q[..., :ROWS, :], k, v, is_causal)
        ctx.save_for_backward(q, k, v, o, torch.zeros(q.shape[:-1]))  # o and an L-shaped tensor, as the rule asks
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, _, _ = ctx.saved_tensors
        big = q.shape[-2] * k.shape[-2] >= 2 ** 20
        rows = slice(0, ROWS) if big else slice(None)
        with torch.enable_grad():
            qs, ks, vs = (t.detach().requires_grad_() for t in (q[..., rows, :], k, v))
            o = _attention(qs, ks, vs, ctx.is_causal)
        dq_rows, dk, dv = torch.autograd.grad(o, (qs, ks, vs), do[..., rows, :])
        dq = torch.zeros_like(q)
        dq[..., rows, :] = dq_rows
        return dq, dk, dv, None
'''

# A ring whose hops carry the bytes the method's do (K, and a V-sized message), which keeps every K it receives and
# only the first 4 columns of V when d is large (the columns the observation used to keep); zeros in the others.
RING_FEW_COLUMNS = '''
def ring_attention(q, k, v, is_causal=False):
    rank, n = dist.get_rank(), dist.get_world_size()
    cols = 4 if v.shape[-1] > 1024 else v.shape[-1]
    keys, values = {rank: k}, {rank: v[..., :cols].clone()}
    held = torch.stack([k, v])
    for step in range(1, n):
        incoming = torch.empty_like(held)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, held, (rank + 1) % n),
                                            dist.P2POp(dist.irecv, incoming, (rank - 1) % n)]):
            work.wait()
        source = (rank - step) % n
        keys[source], values[source] = incoming[0].clone(), incoming[1][..., :cols].clone()
        held = incoming
    kk = torch.cat([keys[r] for r in range(n)], dim=-2)
    vv = torch.cat([values[r] for r in range(n)], dim=-2)
    s = q @ kk.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        c = q.shape[-2]
        s = s.masked_fill(torch.arange(n * c)[None, :] > rank * c + torch.arange(c)[:, None], float("-inf"))
    out = torch.zeros_like(q)
    out[..., :cols] = s.softmax(-1) @ vv
    return out
'''

ATTACKS = {  # (exercise, source, checks whose points it must not earn: their titles start so)
    "flash_first_rows": ("FlashAttention", FLASH_FIRST_ROWS, ["Saves q, k, v, o and L", "Forward + backward never"]),
    "ring_few_columns": ("ring_attention", RING_FEW_COLUMNS, None),
}


def graded(exercise: str, source: str, salt: int):
    ex = get_exercise(exercise)
    return ex.grade(student_observation(exercise, source, salt), reference_observation(exercise, salt))


@pytest.mark.parametrize("salt", [0, 1])  # the salts of test_variants.py: their observations are shared
def test_the_reference_keeps_every_point_of_the_sketched_scenarios(salt):
    for exercise in ("FlashAttention", "ring_attention", "TensorParallelMLP"):
        results = graded(exercise, reference_source(exercise), salt)
        assert all(r.passed for r in results), (exercise, [r for r in results if not r.passed])


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_computing_only_the_kept_slice_earns_no_method_points(attack):
    exercise, source, method_checks = ATTACKS[attack]
    results = graded(exercise, source, 0)
    failed = {r.title for r in results if not r.passed}
    if method_checks is None:  # every check of the memory scenario
        method_checks = [r.title for r in results if "memory" in r.title.lower()]
    assert method_checks
    for title in method_checks:
        assert any(f.startswith(title) for f in failed), (attack, title, sorted(failed))
