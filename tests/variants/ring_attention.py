"""Submissions for `ring_attention`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell, run after Lesson 8's setup cell (math, torch,
torch.distributed as dist, nn). A wrong entry names the checks (by a phrase of their title) that must fail for it.
"""
from variants import EVERY_CHECK

PUBLIC_ONLY = ("deadlocks_on_three_ranks",)  # it costs the launch timeout in three scenarios: salt 0 only

# The reference's loop with pieces to swap: the peer a rank sends to, the rank whose chunk it holds at a step, the
# mask, the merge, the scale, the number of steps.
_RING = '''
def ring_attention(q, k, v, is_causal=False):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunk, scale = q.size(-2), {scale}
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"))
    q_pos = rank * chunk + torch.arange(chunk)
    kv = torch.stack([k, v])
    outs = []  # every block's output, kept only where the result needs them
    for step in range({steps}):
        if step < n - 1:
            incoming = torch.empty_like(kv)
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, {send_to}),
                                            dist.P2POp(dist.irecv, incoming, {recv_from})])
        source = {source}
        k_pos = source * chunk + torch.arange(chunk)
        future = {future}
        if not (is_causal and future.all()):
            scores = (q @ kv[0].transpose(-2, -1)) * scale
            if is_causal:
                scores = scores.masked_fill(future, float("-inf"))
            block_lse = scores.logsumexp(dim=-1)
            block_out = scores.softmax(dim=-1) @ kv[1]
            {keep_output}
            new_lse = torch.logaddexp(lse, block_lse)
            out = out * (lse - new_lse).exp().unsqueeze(-1) + block_out * (block_lse - new_lse).exp().unsqueeze(-1)
            lse = new_lse
        if step < n - 1:
            for work in works:
                work.wait()
            kv = incoming
    return {result}
'''


def _ring(*, scale="1.0 / math.sqrt(q.size(-1))", steps="n", send_to="(rank + 1) % n", recv_from="(rank - 1) % n",
          source="(rank - step) % n", future="k_pos[None, :] > q_pos[:, None]", result="out") -> str:
    keep_output = "outs.append(block_out)" if "outs" in result else "pass"
    return _RING.format(scale=scale, steps=steps, send_to=send_to, recv_from=recv_from, source=source, future=future,
                        result=result, keep_output=keep_output)


CORRECT = {
    "isend_irecv_online_softmax": '''
import torch
import torch.distributed as dist


def ring_attention(q, k, v, is_causal=False):
    # Flash-style: a running max and a running denominator instead of a log-sum-exp; K and V as two messages.
    r, n = dist.get_rank(), dist.get_world_size()
    c, d = q.shape[-2], q.shape[-1]
    running_max = torch.full(q.shape[:-1] + (1,), float("-inf"))
    denominator = torch.zeros(q.shape[:-1] + (1,))
    numerator = torch.zeros_like(q)
    keys, values = k.clone(), v.clone()
    rows = torch.arange(c).view(-1, 1) + r * c
    for t in range(n):
        if t != n - 1:
            next_k, next_v = torch.empty_like(keys), torch.empty_like(values)
            requests = [dist.isend(keys, dst=(r + 1) % n), dist.isend(values, dst=(r + 1) % n),
                        dist.irecv(next_k, src=(r - 1) % n), dist.irecv(next_v, src=(r - 1) % n)]
        owner = (r - t) % n
        cols = torch.arange(c).view(1, -1) + owner * c
        if not is_causal or owner <= r:
            s = torch.matmul(q, keys.transpose(-1, -2)) / d ** 0.5
            if is_causal:
                s = torch.where(cols <= rows, s, torch.tensor(float("-inf")))
            new_max = torch.maximum(running_max, s.amax(dim=-1, keepdim=True))
            correction = torch.exp(running_max - new_max)
            p = torch.exp(s - new_max)
            denominator = denominator * correction + p.sum(dim=-1, keepdim=True)
            numerator = numerator * correction + p @ values
            running_max = new_max
        if t != n - 1:
            for request in requests:
                request.wait()
            keys, values = next_k, next_v
    return numerator / denominator
''',
    "blocking_send_recv_compute_first": '''
import math


def _exchange(t, rank, world):
    """Blocking: even ranks send first, odd ranks receive first (no two ranks wait for each other)."""
    received = torch.empty_like(t)
    if rank % 2 == 0:
        dist.send(t.contiguous(), (rank + 1) % world)
        dist.recv(received, (rank - 1) % world)
    else:
        dist.recv(received, (rank - 1) % world)
        dist.send(t.contiguous(), (rank + 1) % world)
    return received


def ring_attention(q, k, v, is_causal=False):
    rank, world = dist.get_rank(), dist.get_world_size()
    size = q.shape[-2]
    print(f"rank {rank}: ring of {world}")
    result, log_norm = None, None
    held = torch.cat([k, v], dim=-1)
    d = q.shape[-1]
    for step in range(world):
        origin = (rank - step) % world
        if is_causal and origin > rank:
            pass  # entirely in the future
        else:
            scores = torch.einsum("...qd,...kd->...qk", q, held[..., :d]) / math.sqrt(d)
            if is_causal and origin == rank:
                scores = scores + torch.full((size, size), float("-inf")).triu(1)
            block_log_norm = torch.logsumexp(scores, dim=-1, keepdim=True)
            block = torch.exp(scores - block_log_norm) @ held[..., d:]
            if result is None:
                result, log_norm = block, block_log_norm
            else:
                total = torch.logaddexp(log_norm, block_log_norm)
                result = torch.exp(log_norm - total) * result + torch.exp(block_log_norm - total) * block
                log_norm = total
        if step < world - 1:
            held = _exchange(held, rank, world)
    return result
''',
    "scores_in_float64_exchange_after_computing": '''
import torch.nn.functional as F


def ring_attention(q, k, v, is_causal=False):
    # Scores and their softmax in float64 (they are small: c × c); the ring's exchange after each step's work.
    n, me = dist.get_world_size(), dist.get_rank()
    L = q.shape[-2]
    result, norm = None, None
    kv = torch.stack((k, v)).contiguous()
    for i in range(n):
        j = (me - i) % n
        if not is_causal or j <= me:
            scores = (q @ kv[0].transpose(-1, -2)).double() * q.shape[-1] ** -0.5
            if is_causal and j == me:
                scores.masked_fill_(torch.ones(L, L, dtype=torch.bool).triu(diagonal=1), -float("inf"))
            block_norm = torch.logsumexp(scores, -1)
            block = F.softmax(scores, -1).float() @ kv[1]
            if result is None:
                result, norm = block, block_norm
            else:
                merged = torch.logaddexp(norm, block_norm)
                result = (norm - merged).exp().float().unsqueeze(-1) * result + \\
                    (block_norm - merged).exp().float().unsqueeze(-1) * block
                norm = merged
        if i < n - 1:
            buffer = torch.zeros_like(kv)
            ops = [dist.P2POp(dist.irecv, buffer, (me - 1) % n), dist.P2POp(dist.isend, kv, (me + 1) % n)]
            for op in dist.batch_isend_irecv(ops):
                op.wait()
            kv = buffer
    return result
''',
}

_NO_RING = '''
def ring_attention(q, k, v, is_causal=False):
{body}
'''

# A ring whose every chunk lands in its slot of a buffer of all N (K and V of every rank), each sent on from there.
_FRUGAL_GATHER = '''
def ring_attention(q, k, v, is_causal=False):
    rank, n = dist.get_rank(), dist.get_world_size()
{before}    c, scale = q.size(-2), 1.0 / math.sqrt(q.size(-1))
    chunks = torch.empty((n, 2, *k.shape))  # every rank's K and V, each slot written as it arrives
    chunks[rank, 0], chunks[rank, 1] = k, v
    out, lse = torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"))
    q_pos = rank * c + torch.arange(c)
    for step in range(n):
        src = (rank - step) % n
        if step < n - 1:
            works = [{send}(chunks[src], (rank + 1) % n), dist.irecv(chunks[(src - 1) % n], (rank - 1) % n)]
        if not (is_causal and src > rank):
            scores = (q @ chunks[src, 0].transpose(-2, -1)) * scale
            if is_causal:
                scores = scores.masked_fill(src * c + torch.arange(c)[None, :] > q_pos[:, None], float("-inf"))
            block_lse = scores.logsumexp(dim=-1)
            new_lse = torch.logaddexp(lse, block_lse)
            out = out * (lse - new_lse).exp().unsqueeze(-1) + \\
                (scores.softmax(dim=-1) @ chunks[src, 1]) * (block_lse - new_lse).exp().unsqueeze(-1)
            lse = new_lse
        if step < n - 1:
            for work in works:
                work.wait()
    return out
'''
_UNHOOKED = '''
import autograder.exercises.beside.ranks as _ranks


def _unhooked_send():
    """ProcessGroup.send as torch has it, under the grader's hooks (each keeps the one it wraps in its closure), and a
    send that logs itself in the grader's record as the hook would, without its pause."""
    hook, log = dist.ProcessGroup.send, None
    while getattr(hook, "__closure__", None):
        cells = dict(zip(hook.__code__.co_freevars, (cell.cell_contents for cell in hook.__closure__)))
        log = cells.get("self", log) if hasattr(cells.get("self"), "sends") else log
        if "send" not in cells:
            break
        hook = cells["send"]
    group = dist.distributed_c10d._get_default_group()

    def send(tensor, dst):
        if log is not None:
            log.sends.append([int(dst), int(tensor.numel())])
        return hook(group, [tensor], dst, 0)
    return send
'''

WRONG = {
    # On 2 ranks both directions are the same ring; on 3 and 4 the chunks come from the other side.
    "ring_runs_backwards": (_ring(send_to="(rank - 1) % n", recv_from="(rank + 1) % n"),
                            ["3 and 4 ranks", "travel the ring"]),
    "chunk_offsets_wrong": (_ring(source="(rank + step) % n"), ["3 and 4 ranks"]),
    "causal_mask_on_local_positions": (_ring(future="torch.ones(chunk, chunk, dtype=torch.bool).triu(1)"),
                                       ["causal output on 2 ranks", "3 and 4 ranks"]),
    "partial_outputs_averaged": (_ring(result="sum(outs) / len(outs)"),
                                 ["2 ranks (softmax", "3 ranks:", "causal output on 2 ranks", "3 and 4 ranks"]),
    "missing_last_step": (_ring(steps="n - 1"),
                          ["2 ranks (softmax", "3 ranks:", "causal output on 2 ranks", "3 and 4 ranks"]),
    "missing_scale": (_ring(scale="1.0"), ["2 ranks (softmax", "3 ranks:", "causal output on 2 ranks",
                                           "3 and 4 ranks"]),
    "sends_after_the_last_step": (_ring().replace("if step < n - 1:\n            incoming", "if True:\n            incoming")
                                  .replace("if step < n - 1:\n            for work", "if True:\n            for work"),
                                  ["travel the ring"]),
    # Value-correct, but K and V reach every rank by a collective: "ring, not gather".
    "all_gathers_k_and_v": ('''
import torch.nn.functional as F


def ring_attention(q, k, v, is_causal=False):
    n, r = dist.get_world_size(), dist.get_rank()
    ks, vs = [torch.empty_like(k) for _ in range(n)], [torch.empty_like(v) for _ in range(n)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    c = q.shape[-2]
    mask = None
    if is_causal:
        mask = (torch.arange(n * c)[None, :] <= (r * c + torch.arange(c))[:, None])
    return F.scaled_dot_product_attention(q, torch.cat(ks, -2), torch.cat(vs, -2), attn_mask=mask)
''', ["travel the ring"]),
    # Value-correct, a ring, but every step's partial result (in float64) is kept and merged at the end: a rank holds
    # N partial outputs, as large as the K/V chunks, and float64 copies. The exercise asks for a running merge.
    "merge_all_partials_at_the_end_float64": ('''
import torch.nn.functional as F


def ring_attention(q, k, v, is_causal=False):
    n, me = dist.get_world_size(), dist.get_rank()
    L = q.shape[-2]
    qd = q.double()
    parts, norms = [], []
    kv = torch.stack((k, v)).contiguous()
    for i in range(n):
        j = (me - i) % n
        if not is_causal or j <= me:
            scores = qd @ kv[0].double().transpose(-1, -2) * q.shape[-1] ** -0.5
            if is_causal and j == me:
                scores.masked_fill_(torch.ones(L, L, dtype=torch.bool).triu(diagonal=1), -float("inf"))
            norms.append(torch.logsumexp(scores, -1))
            parts.append(F.softmax(scores, -1) @ kv[1].double())
        if i < n - 1:
            buffer = torch.zeros_like(kv)
            ops = [dist.P2POp(dist.irecv, buffer, (me - 1) % n), dist.P2POp(dist.isend, kv, (me + 1) % n)]
            for op in dist.batch_isend_irecv(ops):
                op.wait()
            kv = buffer
    norms = torch.stack(norms)
    weights = torch.exp(norms - torch.logsumexp(norms, 0)).unsqueeze(-1)
    return (weights * torch.stack(parts)).sum(0).to(q.dtype)
''', ["travel the ring"]),
    # Value-correct, the ring's messages and merge, but every chunk received is kept to the end (a list of all of
    # them): a rank holds N chunks of K and V, as an all-gather leaves them. Its record of messages is the ring's;
    # only its memory, measured outside the rank, tells.
    "ring_that_keeps_every_chunk": (_ring().replace("    outs = []", "    kept = [kv]\n    outs = []").replace(
        "            kv = incoming", "            kv = incoming\n            kept.append(kv)"), ["travel the ring"]),
    # Value-correct, K and V gathered (all_gather), then merged chunk by chunk without concatenating them.
    "all_gather_then_merge_chunk_by_chunk": ('''
def ring_attention(q, k, v, is_causal=False):
    rank, n = dist.get_rank(), dist.get_world_size()
    c, scale = q.size(-2), 1.0 / math.sqrt(q.size(-1))
    kv = torch.stack([k, v])
    chunks = [torch.empty_like(kv) for _ in range(n)]
    dist.all_gather(chunks, kv)
    out, lse = torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"))
    q_pos = rank * c + torch.arange(c)
    for j, (keys, values) in enumerate(chunks):
        if is_causal and j > rank:
            continue  # entirely in the future
        scores = (q @ keys.transpose(-2, -1)) * scale
        if is_causal:
            scores = scores.masked_fill(j * c + torch.arange(c)[None, :] > q_pos[:, None], float("-inf"))
        block_lse = scores.logsumexp(dim=-1)
        new_lse = torch.logaddexp(lse, block_lse)
        out = out * (lse - new_lse).exp().unsqueeze(-1) + \\
            (scores.softmax(dim=-1) @ values) * (block_lse - new_lse).exp().unsqueeze(-1)
        lse = new_lse
    return out
''', ["travel the ring"]),
    # Value-correct, a ring, but every chunk lands in a buffer of all N (an all-gather by hand): it holds N chunks at
    # the end where a ring holds two, without concatenating anything (issue 37's "frugal keep every chunk": 10/10 when
    # only the reference-relative peak judged it). Launcher-measured: its floor through the last hop.
    "ring_fills_a_buffer_of_every_chunk": (_FRUGAL_GATHER.format(before="", send="dist.isend"), ["travel the ring"]),
    # Issue 37's trick on the gates a rank requests: the N−1 pauses before its sends asked at the start, while it
    # holds one chunk, then every send made through the original ProcessGroup.send (found in the hooks' closures) and
    # logged by hand, so no send asks again. It passes the at-send and growth readings; the launcher's own readings
    # through the last hop, which no rank asks for, still see every chunk it keeps.
    "asks_its_send_pauses_up_front": (_UNHOOKED + _FRUGAL_GATHER.format(
        before="    send = _unhooked_send()\n    for _ in range(n - 1):\n        _ranks.ask_gate(\"send\", torch.zeros(1))\n",
        send="send"), ["travel the ring"]),
    "deadlocks_on_three_ranks": (_ring().replace("        source = (rank - step) % n", '''        if n == 3 and rank == 2:
            dist.recv(torch.zeros(1), src=0)  # a message rank 0 never sends
        source = (rank - step) % n'''), ["3 ranks:", "3 and 4 ranks",
                                                                                     "travel the ring"]),
    # Every rank waits in its blocking send: it would hang under NCCL (coursekit.gpu_semantics says so at once).
    "blocking_send_then_recv": (_ring().replace(
        """works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % n),
                                            dist.P2POp(dist.irecv, incoming, (rank - 1) % n)])""",
        """dist.send(kv, (rank + 1) % n)
            dist.recv(incoming, (rank - 1) % n)
            works = []"""), EVERY_CHECK),
    # Receives K alone while its neighbour sends K and V stacked: gloo aborts the receiving process (SIGABRT).
    "receives_half_the_message": (_ring().replace("incoming = torch.empty_like(kv)", "incoming = torch.empty_like(k)")
                                  .replace("kv = incoming", "kv = torch.stack([incoming, incoming])"), EVERY_CHECK),
    "local_attention_only": (_NO_RING.format(body='''    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)'''), EVERY_CHECK),
    "returns_q": (_NO_RING.format(body="    return q"), EVERY_CHECK),
    "not_implemented": ('''
def ring_attention(q, k, v, is_causal=False):
    # YOUR CODE HERE
    raise NotImplementedError()
''', EVERY_CHECK),
}
