"""Submissions for `ExpertParallelMoE`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell, run after Lesson 8's setup cell (math, torch,
torch.distributed as dist, nn). A wrong entry names the checks (by a phrase of their title) that must fail for it.
"""
from variants import EVERY_CHECK

PUBLIC_ONLY = ("assumes_it_receives_what_it_sends",)  # mismatched splits may hang until the launch timeout

# The reference's structure with pieces to swap (each wrong variant changes one).
_ALL_TO_ALL = '''
class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send_counts, recv_counts):
        ctx.counts = (send_counts, recv_counts)
        received = x.new_empty((sum(recv_counts), *x.shape[1:]))
        dist.all_to_all_single(received, x.contiguous(), recv_counts, send_counts)
        return received

    @staticmethod
    def backward(ctx, grad):
        send_counts, recv_counts = ctx.counts
        returned = grad.new_empty((sum(send_counts), *grad.shape[1:]))
        dist.all_to_all_single(returned, grad.contiguous(), send_counts, recv_counts)
        return returned, None, None


def plain_all_to_all(x, send_counts, recv_counts):
    received = x.new_empty((sum(recv_counts), *x.shape[1:]))
    dist.all_to_all_single(received, x.detach().contiguous(), recv_counts, send_counts)
    return received
'''

_MOE = '''

class ExpertParallelMoE(nn.Module):
    def __init__(self, router, experts):
        super().__init__()
        self.world_size, rank = dist.get_world_size(), dist.get_rank()
        self.per_rank = len(experts) // self.world_size
        self.router = router
        self.local_experts = {local_experts}

    def forward(self, x):
        probs = self.router(x).softmax(dim=-1)
        expert = probs.argmax(dim=-1)
        gate = probs.gather(-1, expert[:, None])
        order = expert.argsort(stable=True)
        sent_per_expert = torch.bincount(expert, minlength=self.per_rank * self.world_size)
        got_per_expert = torch.empty_like(sent_per_expert)
        dist.all_to_all_single(got_per_expert, sent_per_expert)
        got_per_expert = got_per_expert.view(self.world_size, self.per_rank)
        send_counts = sent_per_expert.view(self.world_size, self.per_rank).sum(dim=1).tolist()
        recv_counts = {recv_counts}
        received = {dispatch}(x[order], send_counts, recv_counts)
        row_expert = {row_expert}
        results = torch.zeros_like(received)
{loop}
        returned = {dispatch}(results, recv_counts, send_counts)
        unsort = torch.empty_like(order)
        unsort[order] = torch.arange(len(order))
        return {result}
'''

_LOCAL_IDS = ("torch.arange(self.per_rank).repeat(self.world_size).repeat_interleave(got_per_expert.flatten())")
_LOOP = """        for j, expert_module in enumerate(self.local_experts[:self.per_rank]):
            rows = (row_expert == j).nonzero().squeeze(1)
            results = results.index_put((rows,), expert_module(received[rows]))"""


def _moe(*, local_experts="nn.ModuleList(experts[rank * self.per_rank:(rank + 1) * self.per_rank])",
         recv_counts="got_per_expert.sum(dim=1).tolist()", dispatch="AllToAll.apply", row_expert=_LOCAL_IDS,
         result="gate * returned[unsort]", loop=_LOOP) -> str:
    return _ALL_TO_ALL + _MOE.format(local_experts=local_experts, recv_counts=recv_counts, dispatch=dispatch,
                                     row_expert=row_expert, result=result, loop=loop)


CORRECT = {
    "list_all_to_all_with_padding": '''
import torch
import torch.distributed as dist
from torch import nn


def _padded_exchange(rows, send_counts, recv_counts):
    """List-form all_to_all needs equal sizes on gloo: pad every group to the largest count of any pair."""
    world = dist.get_world_size()
    longest = torch.tensor([max(send_counts + recv_counts)])
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    width = int(longest)
    outgoing = []
    for group in rows.split(send_counts):
        padded = rows.new_zeros((width, rows.shape[1]))
        padded[:len(group)] = group
        outgoing.append(padded)
    incoming = [rows.new_empty((width, rows.shape[1])) for _ in range(world)]
    dist.all_to_all(incoming, outgoing)
    return torch.cat([chunk[:count] for chunk, count in zip(incoming, recv_counts)])


class Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, send_counts, recv_counts):
        ctx.save = (list(send_counts), list(recv_counts))
        return _padded_exchange(rows, list(send_counts), list(recv_counts))

    @staticmethod
    def backward(ctx, grad):
        send_counts, recv_counts = ctx.save
        return _padded_exchange(grad.contiguous(), recv_counts, send_counts), None, None


class ExpertParallelMoE(nn.Module):
    def __init__(self, router, experts):
        super().__init__()
        world, me = dist.get_world_size(), dist.get_rank()
        self.k = len(experts) // world
        self.router = router
        self.mine = nn.ModuleList([experts[i] for i in range(me * self.k, (me + 1) * self.k)])

    def forward(self, x):
        world = dist.get_world_size()
        logits = self.router(x)
        chosen = torch.argmax(logits, dim=1)
        gate = torch.softmax(logits, dim=1)[torch.arange(len(x)), chosen].unsqueeze(1)
        perm = torch.sort(chosen, stable=True).indices
        mine_from = torch.zeros(world * self.k, dtype=torch.long)
        dist.all_to_all_single(mine_from, torch.bincount(chosen, minlength=world * self.k))
        table = mine_from.view(world, self.k)
        send = torch.bincount(chosen // self.k, minlength=world).tolist()
        recv = table.sum(1).tolist()
        rows = Exchange.apply(x[perm], send, recv)
        local = torch.cat([torch.full((int(c),), j) for counts in table for j, c in enumerate(counts)]).long()
        out = torch.cat([self.mine[int(j)](rows[i:i + 1]) for i, j in enumerate(local)]) if len(rows) else rows * 0
        back = Exchange.apply(out, recv, send)
        y = torch.zeros_like(back).index_add(0, perm, back)
        return y * gate
''',
    "autograd_all_to_all_from_torch_and_expert_ids_sent": '''
import torch.distributed.nn.functional as dist_nn


class ExpertParallelMoE(nn.Module):
    """Sends each token's expert id along with it; uses torch's autograd-aware all_to_all_single."""

    def __init__(self, router, experts):
        super().__init__()
        n = dist.get_world_size()
        per = len(experts) // n
        self.first = dist.get_rank() * per
        self.per = per
        self.router = router
        self.my_experts = experts[self.first:self.first + per]

    def forward(self, x):
        n = dist.get_world_size()
        p = torch.softmax(self.router(x), dim=-1)
        g, e = p.max(dim=-1)
        dest = e // self.per
        idx = torch.argsort(dest, stable=True)
        send = torch.bincount(dest, minlength=n)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        send, recv = send.tolist(), recv.tolist()
        ids = torch.empty(sum(recv), dtype=torch.long)
        dist.all_to_all_single(ids, e[idx].contiguous(), recv, send)
        rows = dist_nn.all_to_all_single(torch.empty(sum(recv), x.shape[1]), x[idx], recv, send)
        done = torch.zeros_like(rows)
        for j, module in enumerate(self.my_experts):
            hit = ids == self.first + j
            done = done.masked_scatter(hit[:, None], module(rows[hit]))  # also with no row: backward must run
        back = dist_nn.all_to_all_single(torch.empty(x.shape[0], x.shape[1]), done, send, recv)
        out = torch.empty_like(back)
        out = out.index_copy(0, idx, back)
        return g.unsqueeze(-1) * out
''',
}

WRONG = {
    "not_unpermuted": (_moe(result="gate * returned"), ["output equals", "3 ranks"]),
    "no_gate": (_moe(result="returned[unsort]"), ["output equals", "router", "3 ranks"]),
    "dispatch_outside_autograd": (_moe(dispatch="plain_all_to_all"),
                                  ["x.grad equals", "expert's gradient", "3 ranks", "all-to-all"]),
    # Keeps the whole list and picks expert j of it, not expert r·E/N + j: other ranks' (not real) experts.
    "local_index_into_the_full_list": (_moe(local_experts="experts"),
                                       ["output equals", "x.grad equals", "expert's gradient", "3 ranks"]),
    # Global expert ids used as indices into the rank's own list: out of range on every rank but rank 0.
    # A rank that receives no row skips its experts: its combine no longer depends on its dispatch, so its backward
    # never runs the dispatch's all-to-all, and the other ranks wait for it.
    "skips_experts_without_rows": (_moe(loop="""        for j, expert_module in enumerate(self.local_experts):
            rows = (row_expert == j).nonzero().squeeze(1)
            if len(rows):
                results = results.index_put((rows,), expert_module(received[rows]))"""), ["3 ranks"]),
    "global_expert_id_as_local_index": (_moe(
        row_expert="(dist.get_rank() * self.per_rank + torch.arange(self.per_rank)).repeat(self.world_size)"
                   ".repeat_interleave(got_per_expert.flatten())",
        loop="""        for e in row_expert.unique().tolist():  # global ids
            rows = (row_expert == e).nonzero().squeeze(1)
            results = results.index_put((rows,), self.local_experts[e](received[rows]))"""), EVERY_CHECK),
    # Assumes every rank receives from each rank as many rows as it sends there: wrong for uneven counts.
    # On 2 ranks it can pass by chance (as many rows each way); on 3 ranks gloo aborts the receiving rank (SIGABRT).
    "assumes_it_receives_what_it_sends": (_moe(recv_counts="list(send_counts)"), ["3 ranks"]),
    "list_all_to_all_without_padding": (_moe(dispatch="ListExchange.apply").replace("class AllToAll", '''
class ListExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send_counts, recv_counts):
        ctx.counts = (send_counts, recv_counts)
        incoming = [x.new_empty((c, x.shape[1])) for c in recv_counts]
        dist.all_to_all(incoming, list(x.contiguous().split(send_counts)))
        return torch.cat(incoming)

    @staticmethod
    def backward(ctx, grad):
        send_counts, recv_counts = ctx.counts
        incoming = [grad.new_empty((c, grad.shape[1])) for c in send_counts]
        dist.all_to_all(incoming, list(grad.contiguous().split(recv_counts)))
        return torch.cat(incoming), None, None


class AllToAll'''), EVERY_CHECK),
    # Value-correct, but every rank gathers every token (and sums the outputs back): "all-to-all, not gather".
    "all_gathers_the_tokens": ('''
import torch.distributed.nn.functional as dist_nn


class ExpertParallelMoE(nn.Module):
    def __init__(self, router, experts):
        super().__init__()
        n, r = dist.get_world_size(), dist.get_rank()
        self.per = len(experts) // n
        self.first = r * self.per
        self.router = router
        self.mine = experts[self.first:self.first + self.per]

    def forward(self, x):
        n, r = dist.get_world_size(), dist.get_rank()
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(n)]
        dist.all_gather(sizes, torch.tensor([len(x)]))
        sizes = [int(s) for s in sizes]
        longest = max(sizes)
        padded = torch.cat([x, x.new_zeros((longest - len(x), x.shape[1]))])
        everyone = torch.cat([part[:size] for part, size in zip(dist_nn.all_gather(padded), sizes)])
        probs = self.router(everyone).softmax(-1)
        expert = probs.argmax(-1)
        out = torch.zeros_like(everyone)
        for j, module in enumerate(self.mine):
            hit = expert == self.first + j
            out = out.masked_scatter(hit[:, None], module(everyone[hit]))
        out = dist_nn.all_reduce(out)
        start = sum(sizes[:r])
        mine = slice(start, start + len(x))
        my_probs = self.router(x).softmax(-1)
        return my_probs.gather(-1, expert[mine][:, None]) * out[mine]
''', ["all-to-all"]),
    # Issue 25: the same gather, with the grader's record of collectives replaced in the rank (it reports the
    # reference's all-to-alls): only the bytes measured outside the ranks tell.
    "all_gather_with_a_forged_record": ('''
import torch.distributed.nn.functional as dist_nn


class ExpertParallelMoE(nn.Module):
    def __init__(self, router, experts):
        super().__init__()
        import autograder.exercises.expert_parallel_moe.observe as grader

        # in the rank only (not where the cell is defined): the reference's all-to-alls
        grader.collectives = lambda prof: [["all_to_all", 4], ["all_to_all", 64], ["all_to_all", 64]]
        n, r = dist.get_world_size(), dist.get_rank()
        self.per = len(experts) // n
        self.first = r * self.per
        self.router = router
        self.mine = experts[self.first:self.first + self.per]

    def forward(self, x):
        n, r = dist.get_world_size(), dist.get_rank()
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(n)]
        dist.all_gather(sizes, torch.tensor([len(x)]))
        sizes = [int(s) for s in sizes]
        longest = max(sizes)
        padded = torch.cat([x, x.new_zeros((longest - len(x), x.shape[1]))])
        everyone = torch.cat([part[:size] for part, size in zip(dist_nn.all_gather(padded), sizes)])
        probs = self.router(everyone).softmax(-1)
        expert = probs.argmax(-1)
        out = torch.zeros_like(everyone)
        for j, module in enumerate(self.mine):
            hit = expert == self.first + j
            out = out.masked_scatter(hit[:, None], module(everyone[hit]))
        out = dist_nn.all_reduce(out)
        start = sum(sizes[:r])
        mine = slice(start, start + len(x))
        my_probs = self.router(x).softmax(-1)
        return my_probs.gather(-1, expert[mine][:, None]) * out[mine]
''', ["all-to-all"]),
    # Value-correct, the thriftiest gather: every token to every rank, each rank's experts' outputs back to the tokens'
    # ranks by reduce-scatter (and the same in the backward): about N times the all-to-alls' bytes.
    "all_gather_and_reduce_scatter": ('''
import torch.distributed.nn.functional as dist_nn


class ExpertParallelMoE(nn.Module):
    def __init__(self, router, experts):
        super().__init__()
        n, r = dist.get_world_size(), dist.get_rank()
        self.per = len(experts) // n
        self.first = r * self.per
        self.router = router
        self.mine = experts[self.first:self.first + self.per]

    def forward(self, x):
        n = dist.get_world_size()
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(n)]
        dist.all_gather(sizes, torch.tensor([len(x)]))
        longest = max(int(s) for s in sizes)
        padded = torch.cat([x, x.new_zeros((longest - len(x), x.shape[1]))])
        everyone = torch.cat(dist_nn.all_gather(padded))  # n blocks of `longest` rows, padding included
        probs = self.router(everyone).softmax(-1)
        expert = probs.argmax(-1)
        out = torch.zeros_like(everyone)
        for j, module in enumerate(self.mine):
            hit = expert == self.first + j
            out = out.masked_scatter(hit[:, None], module(everyone[hit]))
        mine = dist_nn.reduce_scatter(torch.empty_like(padded), list(out.split(longest)))[:len(x)]
        my_probs = self.router(x).softmax(-1)
        return my_probs.gather(-1, my_probs.argmax(-1, keepdim=True)) * mine
''', ["all-to-all"]),
    # Runs every token on this rank's copy of its expert: only the owner's copy is real, so the values are wrong.
    "computes_every_expert_locally": ('''
class ExpertParallelMoE(nn.Module):
    def __init__(self, router, experts):
        super().__init__()
        self.router, self.experts = router, experts

    def forward(self, x):
        probs = self.router(x).softmax(-1)
        expert = probs.argmax(-1)
        y = torch.stack([self.experts[int(e)](row[None])[0] for e, row in zip(expert, x)])
        return probs.gather(-1, expert[:, None]) * y
''', EVERY_CHECK),
    "returns_x": ('''
class ExpertParallelMoE(nn.Module):
    def __init__(self, router, experts):
        super().__init__()
        self.router = router

    def forward(self, x):
        return x * 1.0
''', EVERY_CHECK),
    "not_implemented": ('''
class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send_counts, recv_counts):
        # YOUR CODE HERE
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, grad):
        # YOUR CODE HERE
        raise NotImplementedError()


class ExpertParallelMoE(nn.Module):
    def __init__(self, router: nn.Linear, experts: nn.ModuleList):
        super().__init__()
        # YOUR CODE HERE
        raise NotImplementedError()

    def forward(self, x):
        # YOUR CODE HERE
        raise NotImplementedError()
''', EVERY_CHECK),
}
