"""Submissions for `TensorParallelMLP`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell, run after Lesson 4's setup cell (which imports torch,
torch.distributed as dist and nn; some cells import again, as students do). A wrong entry names the checks (by a
phrase of their title) that must fail for it.
"""
from variants import EVERY_CHECK

PUBLIC_ONLY = ("deadlocks_on_three_ranks",)  # it costs the launch timeout: graded under salt 0 only

# f and g as in the lesson, used by most wrong variants (each changes one thing).
_F_AND_G = '''
import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F


class F_(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class G_(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad
'''

_MLP = '''

class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        rank, n = dist.get_rank(), dist.get_world_size()
        k = fc1.out_features // n
        block = {block}
        self.w1 = nn.Parameter(fc1.weight.detach()[{w1}].clone())
        self.b1 = nn.Parameter(fc1.bias.detach()[block].clone())
        self.w2 = nn.Parameter(fc2.weight.detach()[{w2}].clone())
        self.b2 = nn.Parameter(fc2.bias.detach().clone())

    def forward(self, x):
{forward}
'''

_GOOD_FORWARD = '''
h = F.gelu(F.linear(F_.apply(x), self.w1, self.b1))
return G_.apply(F.linear(h, self.w2)) + self.b2
'''


def _variant(forward: str = _GOOD_FORWARD, *, f_and_g: str = _F_AND_G, block: str = "slice(rank * k, (rank + 1) * k)",
             w1: str = "block", w2: str = ":, block") -> str:
    body = "\n".join("        " + line for line in forward.strip().splitlines())
    return f_and_g + _MLP.format(block=block, w1=w1, w2=w2, forward=body)


CORRECT = {
    "linear_submodules_and_matmul": '''
import torch
import torch.distributed as dist
from torch import nn


class _Copy(torch.autograd.Function):
    """f"""
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        out = grad_output.contiguous().clone()
        work = dist.all_reduce(out, op=dist.ReduceOp.SUM, async_op=True)
        work.wait()
        return out


class _Reduce(torch.autograd.Function):
    """g"""
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=dist.group.WORLD)
        return x

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.clone()


class TensorParallelMLP(nn.Module):
    def __init__(self, fc1: nn.Linear, fc2: nn.Linear):
        super().__init__()
        world = dist.get_world_size()
        me = dist.get_rank()
        assert fc1.out_features % world == 0
        part = fc1.out_features // world
        self.up = nn.Linear(fc1.in_features, part)
        self.down = nn.Linear(part, fc2.out_features, bias=False)
        with torch.no_grad():
            self.up.weight.copy_(torch.chunk(fc1.weight, world, dim=0)[me])
            self.up.bias.copy_(torch.chunk(fc1.bias, world, dim=0)[me])
            self.down.weight.copy_(torch.chunk(fc2.weight, world, dim=1)[me])
        self.out_bias = nn.Parameter(fc2.bias.detach().clone())
        self.act = nn.GELU()
        print(f"rank {me}: {sum(p.numel() for p in self.parameters())} parameters")

    def forward(self, x):
        h = self.act(_Copy.apply(x) @ self.up.weight.t() + self.up.bias)
        y = _Reduce.apply(h @ self.down.weight.t())
        return y + self.out_bias
''',
    "tensor_split_parameter_dict_imported_all_reduce": '''
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import all_reduce, get_rank, get_world_size
import warnings

warnings.warn("students' cells may warn")


def reduce_from_ranks(t):
    return ReduceForward.apply(t)


class ReduceForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        out = t.detach().clone()
        all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, g):
        return g


class CopyForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        all_reduce(g)
        return g


class TensorParallelMLP(torch.nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        n, r = get_world_size(), get_rank()
        if fc1.out_features % n != 0:
            raise ValueError("hidden size must be divisible by the world size")
        self.shards = nn.ParameterDict({
            "fc2_weight": nn.Parameter(torch.tensor_split(fc2.weight.detach(), n, dim=1)[r].clone()),
            "fc2_bias": nn.Parameter(fc2.bias.detach().clone()),
            "fc1_weight": nn.Parameter(torch.tensor_split(fc1.weight.detach(), n, dim=0)[r].clone()),
            "fc1_bias": nn.Parameter(torch.tensor_split(fc1.bias.detach(), n)[r].clone()),
        })

    def forward(self, x):
        s = self.shards
        hidden = nn.functional.gelu(torch.addmm(s["fc1_bias"], CopyForward.apply(x), s["fc1_weight"].T))
        return torch.add(reduce_from_ranks(hidden.matmul(s["fc2_weight"].T)), s["fc2_bias"])
''',
    "keeps_fc2_for_its_bias": _F_AND_G + '''

class TensorParallelMLP(nn.Module):
    """Keeps the whole fc2 for its bias (its full weight is never used: wasteful, but correct)."""

    def __init__(self, fc1, fc2):
        super().__init__()
        n, r = dist.get_world_size(), dist.get_rank()
        rows = torch.arange(fc1.out_features).reshape(n, -1)[r]
        self.w1 = nn.Parameter(fc1.weight.detach().index_select(0, rows))
        self.b1 = nn.Parameter(fc1.bias.detach().index_select(0, rows))
        self.w2 = nn.Parameter(fc2.weight.detach().index_select(1, rows))
        self.fc2 = fc2

    def forward(self, x):
        x = F_.apply(x)
        y = G_.apply(F.gelu(x @ self.w1.T + self.b1) @ self.w2.T)
        return y + self.fc2.bias
''',
}

_F_IS_G = _F_AND_G.replace('''    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad''', '''    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad''')
_NO_BACKWARD_ALL_REDUCE = _F_AND_G.replace('''        grad = grad.clone()
        dist.all_reduce(grad)
        return grad''', '''        return grad''')
_AVERAGES = _F_AND_G.replace("dist.all_reduce(grad)", "dist.all_reduce(grad, op=dist.ReduceOp.AVG)").replace(
    "dist.all_reduce(total)", "dist.all_reduce(total, op=dist.ReduceOp.AVG)")
_DEADLOCK_ON_THREE = _F_AND_G.replace('''        total = partial.clone()''', '''        if dist.get_rank() == 2:
            dist.recv(torch.zeros(1), src=0)  # waits for a message rank 0 never sends
        total = partial.clone()''')

WRONG = {
    # nn.Linear's weight is (out_features, in_features): "column-parallel" fc1 splits its rows, not its columns.
    "shards_the_wrong_dimension": (_variant(w1=":, block", w2="block"), EVERY_CHECK),  # shapes never fit: it raises
    "interleaved_shards": (_variant(block="slice(rank, None, n)"),
                           ["Keeps this rank's shards", "shard's gradient", "on 3 ranks"]),
    "missing_backward_all_reduce": (_variant(f_and_g=_NO_BACKWARD_ALL_REDUCE),
                                    ["x.grad equals", "on 3 ranks", "backward pass"]),
    "fc2_bias_on_every_rank": (_variant('''
h = F.gelu(F.linear(F_.apply(x), self.w1, self.b1))
return G_.apply(F.linear(h, self.w2, self.b2))
'''), ["output equals", "on 3 ranks"]),
    "all_reduce_in_f_and_g_forward": (_variant(f_and_g=_F_IS_G),
                                      ["output equals", "x.grad equals", "shard's gradient", "on 3 ranks",
                                       "forward pass", "backward pass"]),
    "all_reduce_without_autograd": (_variant('''
h = F.gelu(F.linear(x, self.w1, self.b1))
y = F.linear(h, self.w2)
dist.all_reduce(y)
return y + self.b2
'''), ["x.grad equals", "on 3 ranks", "backward pass"]),
    "averages_instead_of_summing": (_variant(f_and_g=_AVERAGES), ["output equals", "x.grad equals", "on 3 ranks"]),
    "autograd_all_reduce_for_g": (_variant('''
import torch.distributed.nn.functional as dist_nn
h = F.gelu(F.linear(F_.apply(x), self.w1, self.b1))
return dist_nn.all_reduce(F.linear(h, self.w2)) + self.b2
'''), ["x.grad equals", "shard's gradient", "on 3 ranks", "backward pass"]),  # its backward all-reduces too
    "returns_this_ranks_partial_output": (_variant('''
h = F.gelu(F.linear(F_.apply(x), self.w1, self.b1))
return F.linear(h, self.w2) + self.b2
'''), ["output equals", "on 3 ranks", "forward pass"]),  # x.grad is right: f still sums it
    "deadlocks_on_three_ranks": (_variant(f_and_g=_DEADLOCK_ON_THREE), ["on 3 ranks", "forward pass",
                                                                        "backward pass"]),
    # Hostile: torch.distributed.tensor does the exercise; the lesson says it earns nothing.
    "parallelize_module": ('''
import copy
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        self.mlp = nn.Sequential(copy.deepcopy(fc1), nn.GELU(), copy.deepcopy(fc2))
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        parallelize_module(self.mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})

    def forward(self, x):
        return self.mlp(x)
''', EVERY_CHECK),
    "constant_output": ('''
import torch


class TensorParallelMLP(torch.nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        self.out_features = fc2.out_features

    def forward(self, x):
        return torch.zeros(x.shape[0], self.out_features, requires_grad=True)
''', EVERY_CHECK),
    "unsplit_mlp_on_every_rank": ('''
import torch


class TensorParallelMLP(torch.nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))
''', EVERY_CHECK),  # right answers, but no tensor parallelism: it earns nothing
    # Issue 25: the whole MLP on every rank, with shard-shaped parameters (their gradients are right: the full
    # weights are built around them) and an all-reduce of zeros(1) in each pass, for the profiler's count. The
    # layers are true only in each rank's own block, so its outputs are wrong; its bytes are too few.
    "full_mlp_with_shard_parameters_and_token_all_reduces": ('''
import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F


class _Token(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y):
        dist.all_reduce(torch.zeros(1))
        return y.clone()

    @staticmethod
    def backward(ctx, grad):
        dist.all_reduce(torch.zeros(1))
        return grad


class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        rank, n = dist.get_rank(), dist.get_world_size()
        k = fc1.out_features // n
        self.block = slice(rank * k, (rank + 1) * k)
        self.w1 = nn.Parameter(fc1.weight.detach()[self.block].clone())
        self.b1 = nn.Parameter(fc1.bias.detach()[self.block].clone())
        self.w2 = nn.Parameter(fc2.weight.detach()[:, self.block].clone())
        self.b2 = nn.Parameter(fc2.bias.detach().clone())
        self.full = [t.detach().clone() for t in (fc1.weight, fc1.bias, fc2.weight)]

    def forward(self, x):
        w1, b1, w2 = self.full
        s = self.block
        w1 = torch.cat([w1[:s.start], self.w1, w1[s.stop:]])
        b1 = torch.cat([b1[:s.start], self.b1, b1[s.stop:]])
        w2 = torch.cat([w2[:, :s.start], self.w2, w2[:, s.stop:]], dim=1)
        return _Token.apply(F.linear(F.gelu(F.linear(x, w1, b1)), w2, self.b2))
''', EVERY_CHECK),  # issue 37: its shards count only when the ranks combine their results
    # Value-correct, but the forward gathers the hidden activations (and fc2's columns) instead of summing the
    # partial outputs: the forward sends (batch, h) where Megatron sends (batch, d_out).
    "all_gathers_the_hidden_activations": (_F_AND_G + '''

class _GatherColumns(torch.autograd.Function):
    """All-gather along the last dimension; every rank computes the same from the result, so the backward keeps
    this rank's slice of the gradient (no communication)."""
    @staticmethod
    def forward(ctx, t):
        n, rank = dist.get_world_size(), dist.get_rank()
        parts = [torch.empty_like(t) for _ in range(n)]
        dist.all_gather(parts, t.contiguous())
        ctx.size, ctx.rank = t.shape[-1], rank
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.size:(ctx.rank + 1) * ctx.size].contiguous()


class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        rank, n = dist.get_rank(), dist.get_world_size()
        k = fc1.out_features // n
        block = slice(rank * k, (rank + 1) * k)
        self.w1 = nn.Parameter(fc1.weight.detach()[block].clone())
        self.b1 = nn.Parameter(fc1.bias.detach()[block].clone())
        self.w2 = nn.Parameter(fc2.weight.detach()[:, block].clone())
        self.b2 = nn.Parameter(fc2.bias.detach().clone())

    def forward(self, x):
        h = F.gelu(F.linear(F_.apply(x), self.w1, self.b1))
        return F.linear(_GatherColumns.apply(h), _GatherColumns.apply(self.w2), self.b2)
''', ["forward pass"]),
    # Issue 25: the same, with the grader's profiler count replaced in the rank (it reports one all-reduce per pass):
    # the record in the student's process says what the student wants; the bytes measured outside it do not.
    "all_gather_with_a_forged_count": (_F_AND_G + '''

class _GatherColumns(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t.contiguous())
        ctx.size, ctx.rank = t.shape[-1], dist.get_rank()
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.size:(ctx.rank + 1) * ctx.size].contiguous()


class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        import autograder.exercises.tensor_parallel_mlp.observe as grader

        grader.collective_counts = lambda prof: [["all_reduce", 1]]  # in the rank only (not where the cell is defined)
        rank, n = dist.get_rank(), dist.get_world_size()
        k = fc1.out_features // n
        block = slice(rank * k, (rank + 1) * k)
        self.w1 = nn.Parameter(fc1.weight.detach()[block].clone())
        self.b1 = nn.Parameter(fc1.bias.detach()[block].clone())
        self.w2 = nn.Parameter(fc2.weight.detach()[:, block].clone())
        self.b2 = nn.Parameter(fc2.bias.detach().clone())

    def forward(self, x):
        h = F.gelu(F.linear(F_.apply(x), self.w1, self.b1))
        return F.linear(_GatherColumns.apply(h), _GatherColumns.apply(self.w2), self.b2)
''', ["forward pass"]),
    # Value-correct, but the ranks gather the weights (their true blocks) and each runs the whole MLP: no
    # communication of activations at all, and none in the backward.
    "gathers_the_weights": ('''
import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F


class _Gather(torch.autograd.Function):
    """All-gather along dimension ``dim``; the backward keeps this rank's slice (every rank computes the same)."""
    @staticmethod
    def forward(ctx, t, dim):
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t.contiguous())
        ctx.dim, ctx.size, ctx.rank = dim, t.shape[dim], dist.get_rank()
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(ctx.dim, ctx.rank * ctx.size, ctx.size).contiguous(), None


class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        rank, n = dist.get_rank(), dist.get_world_size()
        k = fc1.out_features // n
        block = slice(rank * k, (rank + 1) * k)
        self.w1 = nn.Parameter(fc1.weight.detach()[block].clone())
        self.b1 = nn.Parameter(fc1.bias.detach()[block].clone())
        self.w2 = nn.Parameter(fc2.weight.detach()[:, block].clone())
        self.b2 = nn.Parameter(fc2.bias.detach().clone())

    def forward(self, x):
        w1, b1, w2 = _Gather.apply(self.w1, 0), _Gather.apply(self.b1, 0), _Gather.apply(self.w2, 1)
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2, self.b2)
''', ["forward pass", "backward pass"]),
    # Issue 37's red team: f's all-reduce moved into the forward, on x.grad computed there by hand from the upstream
    # gradient read in the grader's frame; the rank asks at the grader's pause between the passes itself, between
    # its two all-reduces (silencing the grader's own request), and forges the profiler's count: each pass's bytes
    # then looked like one all-reduce (full marks). Now the upstream gradient is drawn from the pause's answer.
    "answers_gates_in_advance": ('''
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F
import autograder.exercises.beside.ranks as ranks
import autograder.exercises.tensor_parallel_mlp.observe as grader


def _ask(y):
    request, reply = ranks._gate_channel
    os.write(request, (json.dumps({"gate": "between forward and backward", "digest": ranks.digest(y)}) + "\\n").encode())
    answer = b""
    while not answer.endswith(b"\\n"):
        answer += os.read(reply, 64)
    return float(answer)


def _upstream():
    frame = sys._getframe(1)
    while frame is not None and "upstream" not in frame.f_locals:
        frame = frame.f_back
    return frame.f_locals["upstream"]


class _Both(torch.autograd.Function):
    """y and x.grad, both summed in the forward; the backward hands back what the forward computed."""
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, upstream):
        pre = F.linear(x, w1, b1)
        y = F.linear(F.gelu(pre), w2)
        dist.all_reduce(y)
        y = y + b2
        if ranks._gate_channel is not None:
            answer = _ask(y)
            grader.ask_gate = lambda name, tensor: answer  # the grader's own request, silenced
        with torch.enable_grad():
            xs, w1s, b1s, w2s = (t.detach().requires_grad_() for t in (x, w1, b1, w2))
            part = F.linear(F.gelu(F.linear(xs, w1s, b1s)), w2s)
            gx, g1, gb, g2 = torch.autograd.grad((part * upstream).sum(), (xs, w1s, b1s, w2s))
        dist.all_reduce(gx)
        ctx.grads = (gx, g1, gb, g2, upstream.sum(0))
        return y

    @staticmethod
    def backward(ctx, grad):
        gx, g1, gb, g2, g2b = ctx.grads
        return gx, g1, gb, g2, g2b, None


class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        grader.collective_counts = lambda prof: [["all_reduce", 1]]  # in the rank only
        rank, n = dist.get_rank(), dist.get_world_size()
        k = fc1.out_features // n
        block = slice(rank * k, (rank + 1) * k)
        self.w1 = nn.Parameter(fc1.weight.detach()[block].clone())
        self.b1 = nn.Parameter(fc1.bias.detach()[block].clone())
        self.w2 = nn.Parameter(fc2.weight.detach()[:, block].clone())
        self.b2 = nn.Parameter(fc2.bias.detach().clone())

    def forward(self, x):
        return _Both.apply(x, self.w1, self.b1, self.w2, self.b2, _upstream())
''', ["backward pass"]),
    "not_implemented": ('''
import torch
from torch import nn


class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        # YOUR CODE HERE
        raise NotImplementedError()

    def forward(self, x):
        # YOUR CODE HERE
        raise NotImplementedError()
''', EVERY_CHECK),
}
